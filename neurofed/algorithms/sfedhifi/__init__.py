"""SFedHIFI (Tao et al., "SFedHIFI: Fire Rate-Based Heterogeneous Information Fusion
for Spiking Federated Learning", 2025) and the heterogeneous-width baselines it is
compared with (``hetero_fedavg``, ``hetero_fedprox``, ``hetero_fednova``).

Clients train models of different widths; the server keeps one global model per width.
The maths are pure functions (:mod:`.fusion`), the keys in :mod:`.options`, the halves in
:mod:`.client` and :mod:`.server`; the choices and what they measured: docs/algorithms.md.
"""

from __future__ import annotations

from neurofed.algorithms.fedavg import FedAvg
from neurofed.algorithms.fednova import FedNova
from neurofed.algorithms.fedprox import FedProx
from neurofed.algorithms.sfedhifi.client import HeteroClient, HeteroFedNovaClient, HeteroFedProxClient
from neurofed.algorithms.sfedhifi.options import (HETERO_CHECKS, HETERO_DEFAULTS, SFEDHIFI_CHECKS, SFEDHIFI_DEFAULTS,
                                                  HeteroConfig)
from neurofed.algorithms.sfedhifi.server import HeteroFedNovaServer, HeteroServer, SFedHIFIServer


class HeteroFedAvg(HeteroConfig, FedAvg):
    """FedAvg within each width (the paper's FedAVG baseline)."""

    name = "hetero_fedavg"
    Server = HeteroServer
    Client = HeteroClient
    config_defaults = HETERO_DEFAULTS
    config_checks = HETERO_CHECKS


class HeteroFedProx(HeteroConfig, FedProx):
    """FedProx within each width (reads ``algorithm.mu`` as FedProx does)."""

    name = "hetero_fedprox"
    Server = HeteroServer
    Client = HeteroFedProxClient
    config_defaults = {**FedProx.config_defaults, **HETERO_DEFAULTS}
    config_checks = {**FedProx.config_checks, **HETERO_CHECKS}


class HeteroFedNova(HeteroConfig, FedNova):
    """FedNova within each width."""

    name = "hetero_fednova"
    Server = HeteroFedNovaServer
    Client = HeteroFedNovaClient
    config_defaults = HETERO_DEFAULTS
    config_checks = HETERO_CHECKS


class SFedHIFI(HeteroConfig, FedAvg):
    """Server: :class:`SFedHIFIServer`; client: :class:`HeteroClient` (Eq. 13–14)."""

    name = "sfedhifi"
    Server = SFedHIFIServer
    Client = HeteroClient
    config_defaults = SFEDHIFI_DEFAULTS
    config_checks = SFEDHIFI_CHECKS
    needs_banks = True
