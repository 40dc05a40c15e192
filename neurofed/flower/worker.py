"""One long-lived ClientApp process per SuperNode (``flower-supernode --isolation process``).

flwr 1.41 runs every message in a new ``flwr-clientapp`` process (its SuperExec
launches one per task, in both isolation modes): each pays the interpreter, the
imports of torch, lava and SLAYER, loading the data set, cutting the shards,
building the models and loading the fast kernels — seconds of work for a client
whose training takes under one. With ``--isolation process`` the SuperNode serves
its tasks on its Runtime API and leaves running them to a process the user starts;
this is that process. It claims the SuperNode's ClientApp tasks as
``flower-superexec`` does and runs each here, so what the first message builds
(:class:`neurofed.flower.client.Node`) serves every later one. Flower still carries
everything else: the message, the run config, the node config, and ``Context.state``
(pulled with each task and pushed back with its output), so SCAFFOLD's c_i and the
other client states persist exactly as with ``flwr-clientapp``.

    flower-supernode --isolation process --port 9094 ... &
    python -m neurofed.flower.worker --runtime-api-address 127.0.0.1:9094 --insecure

A message its SuperNode gives up while the worker is pulling it is dropped here too
(:class:`TaskClient`), so a worker left behind by a killed ServerApp serves the next
run (e.g. ``resume=true``) at once.

The worker runs the neurofed it was started with. It refuses (an error reply naming
the file) the tasks of a run whose FAB ships other neurofed sources, example configs
or hardware profiles than these: restart it from the code the run was started with.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import signal
import threading
import time
import zipfile
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Callable

import httpx

import neurofed.flower  # noqa: F401  (telemetry off before flwr is imported)
from flwr.app import Error, Message
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.message_pb2 import PullObjectRequest, PullObjectResponse  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import AcquireTaskRequest, SendTaskHeartbeatRequest  # pylint: disable=E0611
from flwr.supercore import log
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import RetryInvoker, exponential
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.tls import validate_and_resolve_root_certificates
from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

from neurofed.flower.app import client_app  # torch, lava, SLAYER: imported before any message comes
from neurofed.flower.settings import APP_DIR

# FAB folders whose files must equal this process's for a task to run here.
SHIPPED = ("neurofed/", "examples/", "hw_profiles/")


def differing_file(fab: bytes, root: Path = APP_DIR) -> str | None:
    """The first neurofed source, example config or hardware profile in the FAB that
    differs from the file of the same name under ``root`` (the running neurofed), or None."""
    with zipfile.ZipFile(io.BytesIO(fab)) as z:
        for name in sorted(z.namelist()):
            if name.startswith(SHIPPED) and not name.endswith("/"):
                local = root / name
                if not local.is_file() or local.read_bytes() != z.read(name):
                    return name
    return None


class MessageDropped(Exception):
    """The SuperNode gave up the message of the task being run here."""


class TaskClient(RuntimeHttpClient):
    """The Runtime API client of one task: while an object of the task's message is not
    there yet, it asks ``dropped()`` whether the SuperNode gave the message up, and
    if so ends the pull.

    flwr 1.41's SuperNode pulls a message's objects from the SuperLink after queueing
    its task; when the run ends meanwhile (e.g. its ServerApp was killed between pushing
    a message and its arrays), its ``RunNotRunningException`` (a ``BaseException``)
    skips the ``except Exception`` that would finish the task. The task stays queued,
    its objects never come, and Flower's pull retries them for over an hour (500 tries,
    10 s apart) while heartbeats keep the task alive: a worker serving one task at a
    time would answer no later run's message."""

    dropped: Callable[[], bool] = staticmethod(lambda: False)

    def PullObject(self, request: PullObjectRequest) -> PullObjectResponse:  # pylint: disable=invalid-name
        res = super().PullObject(request)
        if res.object_found and not res.object_available and self.dropped():
            raise MessageDropped(f"the SuperNode gave up the message of run {request.run_id} (its run ended "
                                 f"before the message arrived); serving its next task")
        return res


class Worker:
    """Claims and runs the ClientApp tasks of one SuperNode's Runtime API."""

    def __init__(self, address: str, insecure: bool, root_certificates: str | None = None, poll: float = 0.05):
        self.address, self.insecure, self.root_path = address, insecure, root_certificates
        self.certificates = validate_and_resolve_root_certificates(root_certificates, insecure)
        self.poll = poll
        self.fabs: dict[str, str | None] = {}  # FAB hash -> why its tasks are refused (None: they run here)
        self.tasks = 0
        self.claimed: str | None = None  # token of a task claimed while another ran, run next
        self._claiming = threading.Lock()  # several threads pull a message; one claim only
        self.client = self._client()

    def _client(self, token: str | None = None) -> RuntimeHttpClient:
        interceptors = [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp")]
        if token is not None:
            interceptors.append(RuntimeTokenHttpInterceptor(token))
        client_class = RuntimeHttpClient if token is None else TaskClient
        # Transport errors retried for up to 30 s; any HTTP error ends the call (Flower's
        # own invoker stops the process on a 401, which must not end a long-lived worker).
        retry = RetryInvoker(lambda: exponential(base_delay=0.2, max_delay=2), httpx.TransportError,
                             max_tries=None, max_time=30.0)
        client = client_class.from_server_address(server_address=self.address, insecure=self.insecure,
                                                  root_certificates=self.certificates, interceptors=interceptors,
                                                  retry_invoker=retry)
        if token is not None:  # a task's pull ends once its SuperNode gave the message up
            client.dropped = self.superseded
        return client

    def acquire(self) -> str | None:
        """Claim the SuperNode's oldest queued ClientApp task; its token, or None."""
        res = self.client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        return res.token if res.HasField("task") and res.token else None

    def superseded(self) -> bool:
        """Whether the SuperNode queued another task while the one here waits for its
        message (that task is claimed, and runs next). A SuperNode handles one message at
        a time: it queues the next only after it has all of the previous one's objects, or
        gave the message up; so one whose objects are still missing never comes."""
        with self._claiming:
            if self.claimed is None:
                try:
                    self.claimed = self.acquire()
                except httpx.HTTPError:  # asked again at the pull's next try
                    pass
            return self.claimed is not None

    def serve(self, stop: threading.Event) -> None:
        while not stop.is_set():
            token, self.claimed = self.claimed, None
            try:
                token = token or self.acquire()
            except httpx.HTTPError as exc:  # the SuperNode is restarting: keep asking
                log(WARNING, "neurofed worker: Runtime API at %s: %s", self.address, exc)
                stop.wait(1.0)
                continue
            if token:
                self.run_task(token)
            else:
                stop.wait(self.poll)

    def run_task(self, token: str) -> None:
        client = self._client(token)
        beat = HeartbeatSender(lambda: self._heartbeat(client))
        beat.start()
        context, status, details = None, SubStatus.FAILED, "ClientApp task failed"
        try:
            message, context, _run, fab = pull_task_input(client)
            if fab.hash_str not in self.fabs:
                name = differing_file(fab.content)
                self.fabs[fab.hash_str] = name and (f"the run's {name} differs from the worker's ({APP_DIR}); "
                                                    f"restart the worker from the run's code")
            if self.fabs[fab.hash_str]:
                log(ERROR, "neurofed worker: %s", self.fabs[fab.hash_str])
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                      reason=f"neurofed worker: {self.fabs[fab.hash_str]}"), reply_to=message)
            else:
                reply = client_app(message=message, context=context)
                status, details = SubStatus.COMPLETED, ""
            push_message(client, reply, context)
            self.tasks += 1
        except MessageDropped as exc:  # no reply: the SuperNode waits for none
            log(WARNING, "neurofed worker: %s", exc)
            details = str(exc)
        except Exception as exc:  # pylint: disable=broad-except  (one task failed; the worker goes on)
            log(ERROR, "neurofed worker: task failed: %s: %s", type(exc).__name__, exc)
            details = f"{type(exc).__name__}: {exc}"
        finally:
            beat.stop()
            push_task_output(client=client, context=context, sub_status=status, details=details)
            client.close()

    @staticmethod
    def _heartbeat(client: RuntimeHttpClient) -> bool:
        try:
            client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
            return True
        except httpx.HTTPError:
            return False


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m neurofed.flower.worker",
                                description="A long-lived neurofed ClientApp for a SuperNode started with "
                                            "--isolation process.")
    p.add_argument("--runtime-api-address", required=True, help="the SuperNode's --host:--port")
    p.add_argument("--insecure", action="store_true", help="plain HTTP to the SuperNode (same machine only)")
    p.add_argument("--root-certificates", help="CA certificate that signed the SuperNode's --ssl-certfile")
    p.add_argument("--parent-pid", type=int, help="exit when this process (e.g. the SuperNode) exits")
    p.add_argument("--poll", type=float, default=0.05, help="seconds between task claims when idle")
    args = p.parse_args(argv)
    if not args.insecure and not args.root_certificates:
        p.error("give --root-certificates (the SuperNode serves TLS) or --insecure")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)
    from neurofed.flower import client

    client.fresh_process(False)  # the worker's start-up is not on any message's path
    worker = Worker(args.runtime_api_address, args.insecure, args.root_certificates, args.poll)
    log(INFO, "neurofed worker: serving ClientApp tasks of %s", args.runtime_api_address)
    worker.serve(stop)
    log(INFO, "neurofed worker: stopped after %d tasks", worker.tasks)


if __name__ == "__main__":
    main()
