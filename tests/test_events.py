"""Event data sets: tiny files in each published on-disk format, the pipeline, the
cache, and the synthetic ``digits_events`` generator."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from neurofed.data import load_dataset
from neurofed.data import event_frames
from neurofed.data import events as ev
from neurofed.data import synthetic_events as se


@pytest.fixture(autouse=True)
def no_download(monkeypatch):
    """Any attempt by tonic to download fails the test."""
    import tonic.dataset
    import tonic.download_utils

    def refuse(*args, **kwargs):
        raise AssertionError("tonic tried to download a data set")

    monkeypatch.setattr(tonic.download_utils, "download_and_extract_archive", refuse)
    monkeypatch.setattr(tonic.dataset, "download_and_extract_archive", refuse)
    monkeypatch.setattr(tonic.dataset.Dataset, "download", refuse)


def cfg(name, root=None, cache=None, **extra):
    return {"name": name, "root": None if root is None else str(root), "encoding": "events",
            "timesteps": 4, "cache": None if cache is None else str(cache), **extra}


# --------------------------------------------------------------------------- writers of the published formats


def write_nmnist_bin(path: Path, x, y, t, p) -> None:
    """N-MNIST's 40-bit events: x (8 bit), y (8 bit), polarity (1 bit), t in µs (23 bit)."""
    x, y, t, p = (np.asarray(a, dtype=np.int64) for a in (x, y, t, p))
    raw = np.stack([x, y, (p << 7) | ((t >> 16) & 0x7F), (t >> 8) & 0xFF, t & 0xFF], 1).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw.tobytes())


def random_events(rng, n, size, duration_us=300_000):
    t = np.sort(rng.integers(0, duration_us, n))
    return rng.integers(0, size, n), rng.integers(0, size, n), t, rng.integers(0, 2, n)


def make_nmnist(root: Path, per_digit=(2, 1), seed=0) -> None:
    rng = np.random.default_rng(seed)
    for split, count in zip(("Train", "Test"), per_digit):
        for d in range(10):
            for i in range(count):
                write_nmnist_bin(root / "NMNIST" / split / str(d) / f"{i:05d}.bin", *random_events(rng, 60, 34))


def write_dvsgesture_npy(path: Path, x, y, p, t_ms) -> None:
    """tonic's preprocessed DVS128 Gesture: one (N, 4) array x, y, p, t[ms] per gesture."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.stack([x, y, p, t_ms], 1).astype(np.float64))


def _flatbuffer_ioheader(description: bytes) -> bytes:
    # root offset | "IOHE" | vtable (3 fields: compression, file_data_position defaults;
    # description at +4) | pad | table (soffset, description offset) | string
    vtable = struct.pack("<5H", 10, 8, 0, 0, 4) + b"\0\0"
    table = struct.pack("<iI", 20 - 8, 4)
    string = struct.pack("<I", len(description)) + description + b"\0"
    string += b"\0" * (-len(string) % 4)
    return struct.pack("<I", 20) + b"IOHE" + vtable + table + string


def _flatbuffer_event_packet(t, x, y, on) -> bytes:
    # size prefix | root offset | "EVTS" | vtable | pad | table | vector of 16-byte Event structs
    n = len(t)
    body = np.zeros(n, dtype=np.dtype([("t", "<i8"), ("x", "<i2"), ("y", "<i2"), ("on", "u1"), ("pad", "V3")]))
    body["t"], body["x"], body["y"], body["on"] = t, x, y, on
    buf = (struct.pack("<I", 16) + b"EVTS" + struct.pack("<3H", 6, 8, 4) + b"\0\0"
           + struct.pack("<iI", 8, 4) + struct.pack("<I", n) + body.tobytes())
    return struct.pack("<I", len(buf)) + buf


def write_aedat4(path: Path, t, x, y, on, size=(128, 128)) -> None:
    """An uncompressed AEDAT 4 file with one event stream (what tonic.io.read_aedat4 reads)."""
    desc = (
        '<dv version="2.0"><node name="outInfo" path="/outInfo/"><node name="0" path="/outInfo/0/">'
        '<attr key="compression" type="string">NONE</attr>'
        '<attr key="typeIdentifier" type="string">EVTS</attr>'
        '<node name="info" path="/outInfo/0/info/">'
        f'<attr key="sizeX" type="int">{size[0]}</attr><attr key="sizeY" type="int">{size[1]}</attr>'
        "</node></node></node></dv>"
    ).encode()
    header = _flatbuffer_ioheader(desc)
    half = len(t) // 2  # two packets, as recordings have many
    packets = b""
    for sl in (slice(0, half), slice(half, None)):
        payload = _flatbuffer_event_packet(t[sl], x[sl], y[sl], on[sl])
        packets += struct.pack("<II", 0, len(payload)) + payload
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"#!AER-DAT4.0\r\n" + struct.pack("<I", len(header)) + header + packets)


# --------------------------------------------------------------------------- N-MNIST


def test_nmnist_shapes_labels_and_binary_frames(tmp_path):
    make_nmnist(tmp_path)
    ds = load_dataset(cfg("nmnist", tmp_path), seed=0)
    assert ds.kind == "events" and ds.num_classes == 10
    assert ds.x_train.shape == (20, 2, 34, 34, 4) and ds.x_test.shape == (10, 2, 34, 34, 4)
    assert ds.y_train.tolist() == [d for d in range(10) for _ in range(2)]
    assert ds.y_test.tolist() == list(range(10))
    assert set(np.unique(ds.x_train)) <= {0, 1} and ds.x_train.sum() > 0
    assert ds.info["synthetic"] is False and ds.info["sensor_size"] == (34, 34, 2)


def test_nmnist_events_land_in_channel_row_column_and_bin(tmp_path):
    """Hand-placed events: ON at (x=3, y=5) twice in bin 0 (clipped to one spike),
    OFF at (30, 1) in bin 2, ON at (33, 33) in bin 3. T=4 over 0..1000 µs."""
    make_nmnist(tmp_path)
    x, y, t, p = [3, 3, 30, 33, 0], [5, 5, 1, 33, 0], [0, 100, 500, 760, 1000], [1, 1, 0, 1, 1]
    write_nmnist_bin(tmp_path / "NMNIST" / "Test" / "0" / "00000.bin", x, y, t, p)
    frames = load_dataset(cfg("nmnist", tmp_path)).x_test[0]
    expected = np.zeros((2, 34, 34, 4), np.uint8)
    expected[1, 5, 3, 0] = expected[0, 1, 30, 2] = expected[1, 33, 33, 3] = 1
    # tonic's n_time_bins leaves out the very last event (t=1000); allow either.
    expected_with_last = expected.copy()
    expected_with_last[1, 0, 0, 3] = 1
    assert np.array_equal(frames, expected) or np.array_equal(frames, expected_with_last)

    small = load_dataset(cfg("nmnist", tmp_path, downsample=2)).x_test[0]
    assert small.shape == (2, 17, 17, 4)
    assert small[1, 2, 1, 0] == small[0, 0, 15, 2] == small[1, 16, 16, 3] == 1


def test_bin_by_count_puts_equal_event_counts_in_each_frame(tmp_path):
    make_nmnist(tmp_path)
    # 8 events at distinct pixels, crowded in time at the start: by count, 2 per frame.
    t = [0, 1, 2, 3, 4, 5, 6, 100_000]
    write_nmnist_bin(tmp_path / "NMNIST" / "Test" / "0" / "00000.bin", range(8), [0] * 8, t, [1] * 8)
    by_count = load_dataset(cfg("nmnist", tmp_path, bin_by="count")).x_test[0]
    assert by_count.sum(axis=(0, 1, 2)).tolist() == [2, 2, 2, 2]
    by_time = load_dataset(cfg("nmnist", tmp_path, bin_by="time")).x_test[0]
    assert by_time.sum(axis=(0, 1, 2)).tolist()[0] == 7


def test_denoise_drops_isolated_events(tmp_path):
    make_nmnist(tmp_path)
    # Two bursts of neighbouring events and, between them, one lone event at (30, 30).
    x, y = [10, 11, 10, 30, 20, 21, 20], [10, 10, 11, 30, 20, 20, 21]
    t = [0, 10, 20, 25_000, 50_000, 50_010, 50_020]
    write_nmnist_bin(tmp_path / "NMNIST" / "Test" / "0" / "00000.bin", x, y, t, [1] * 7)
    raw = load_dataset(cfg("nmnist", tmp_path, timesteps=1)).x_test[0]
    kept = load_dataset(cfg("nmnist", tmp_path, timesteps=1, denoise_us=1000)).x_test[0]
    assert raw[1, 30, 30, 0] == 1 and kept[1, 30, 30, 0] == 0
    assert kept[1, 10, 10, 0] == kept[1, 10, 11, 0] == kept[1, 20, 21, 0] == 1


def test_missing_files_error_names_the_expected_layout(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_dataset(cfg("nmnist", tmp_path))
    msg = str(err.value)
    assert "\n" not in msg
    assert "NMNIST/Train/<digit>/*.bin" in msg and "NMNIST/Test/<digit>/*.bin" in msg and str(tmp_path) in msg
    assert "never downloads" in msg

    write_nmnist_bin(tmp_path / "NMNIST" / "Train" / "3" / "00001.bin", [1], [1], [0], [1])
    with pytest.raises(FileNotFoundError, match=r"no NMNIST/Test/<digit>/\*\.bin found") as err:
        load_dataset(cfg("nmnist", tmp_path))
    assert "Train/<digit>/*.bin found" not in str(err.value)

    with pytest.raises(FileNotFoundError, match="data.root"):
        load_dataset(cfg("nmnist", None))
    with pytest.raises(FileNotFoundError, match=r"ibmGestureTrain/user<NN>_<lighting>/\*\.npy"):
        load_dataset(cfg("dvsgesture", tmp_path))
    with pytest.raises(FileNotFoundError, match=r"CIFAR10DVS/<class>/\*\.aedat4"):
        load_dataset(cfg("cifar10dvs", tmp_path))


def test_root_may_be_the_dataset_folder_itself(tmp_path):
    make_nmnist(tmp_path)
    ds = load_dataset(cfg("nmnist", tmp_path / "NMNIST", cache=tmp_path / "c"))
    assert ds.x_train.shape[0] == 20


def test_event_data_needs_events_encoding(tmp_path):
    make_nmnist(tmp_path)
    with pytest.raises(ValueError, match="data.encoding: got 'rate'.*set data.encoding: events"):
        load_dataset({**cfg("nmnist", tmp_path), "encoding": "rate"})


# --------------------------------------------------------------------------- cache


def test_second_load_reads_the_cache_without_binning(tmp_path, monkeypatch):
    make_nmnist(tmp_path)
    first = load_dataset(cfg("nmnist", tmp_path))
    folder = Path(first.info["cache"])
    assert folder.parent == tmp_path / ".neurofed_cache"
    files = sorted(folder.glob("*.npy"))
    mtimes = [f.stat().st_mtime_ns for f in files]

    def no_binning(*args, **kwargs):
        raise AssertionError("re-binned although the frames are cached")

    monkeypatch.setattr(event_frames, "_bin_split", no_binning)
    monkeypatch.setattr(event_frames.EventFrames, "__call__", no_binning)
    second = load_dataset(cfg("nmnist", tmp_path))
    assert isinstance(second.x_train, np.memmap) and second.info["cache"] == str(folder)
    assert np.array_equal(second.x_train, first.x_train) and np.array_equal(second.y_test, first.y_test)
    assert [f.stat().st_mtime_ns for f in files] == mtimes

    # Other parameters, or other files on disk, are other frames.
    with pytest.raises(AssertionError, match="re-binned"):
        load_dataset(cfg("nmnist", tmp_path, timesteps=5))
    write_nmnist_bin(tmp_path / "NMNIST" / "Test" / "9" / "99999.bin", [1], [1], [0], [1])
    with pytest.raises(AssertionError, match="re-binned"):
        load_dataset(cfg("nmnist", tmp_path))


def test_data_cache_setting_chooses_the_folder(tmp_path):
    make_nmnist(tmp_path / "data")
    ds = load_dataset(cfg("nmnist", tmp_path / "data", cache=tmp_path / "frames"))
    assert Path(ds.info["cache"]).parent == tmp_path / "frames"
    assert not (tmp_path / "data" / ".neurofed_cache").exists()


# --------------------------------------------------------------------------- DVS128 Gesture


def test_dvsgesture_from_tonic_user_folders(tmp_path):
    rng = np.random.default_rng(1)
    layout = {"ibmGestureTrain": {"user01_fluorescent": [0, 1, 10], "user02_led": [3]},
              "ibmGestureTest": {"user24_natural": [0, 5]}}
    for split, users in layout.items():
        for user, labels in users.items():
            for label in labels:
                x, y, t_us, p = random_events(rng, 200, 128, duration_us=2_000_000)
                write_dvsgesture_npy(tmp_path / "DVSGesture" / split / user / f"{label}.npy", x, y, p, t_us // 1000)
    ds = load_dataset(cfg("dvsgesture", tmp_path, downsample=4))
    assert ds.num_classes == 11
    assert ds.x_train.shape == (4, 2, 32, 32, 4) and ds.x_test.shape == (2, 2, 32, 32, 4)
    assert sorted(ds.y_train.tolist()) == [0, 1, 3, 10] and sorted(ds.y_test.tolist()) == [0, 5]
    assert sorted(ds.info["users_train"].tolist()) == [1, 1, 1, 2] and ds.info["users_test"].tolist() == [24, 24]
    assert set(np.unique(ds.x_train)) == {0, 1}


# --------------------------------------------------------------------------- CIFAR10-DVS


def test_aedat4_writer_matches_tonic_reader(tmp_path):
    pytest.importorskip("aedat")
    from tonic.io import read_aedat4

    t, x, y, on = np.array([5, 7, 9, 11]), np.array([1, 2, 127, 0]), np.array([3, 4, 0, 127]), np.array([1, 0, 1, 0])
    write_aedat4(tmp_path / "a.aedat4", t, x, y, on)
    events = read_aedat4(str(tmp_path / "a.aedat4"))
    assert events["t"].tolist() == t.tolist() and events["x"].tolist() == x.tolist()
    assert events["y"].tolist() == y.tolist() and events["on"].astype(int).tolist() == on.tolist()


def test_cifar10dvs_from_aedat4_class_folders(tmp_path):
    pytest.importorskip("aedat")
    rng = np.random.default_rng(2)
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    for c in classes:
        for i in range(2):
            x, y, t, p = random_events(rng, 100, 128, duration_us=1_000_000)
            write_aedat4(tmp_path / "CIFAR10DVS" / c / f"cifar10_{c}_{i}.aedat4", t, x, y, p)
    ds = load_dataset(cfg("cifar10dvs", tmp_path, downsample=4, test_fraction=0.5))
    assert ds.x_train.shape == (10, 2, 32, 32, 4) and ds.x_test.shape == (10, 2, 32, 32, 4)
    assert sorted(ds.y_train.tolist()) == list(range(10)) and sorted(ds.y_test.tolist()) == list(range(10))
    assert ds.x_train.sum() > 0
    again = load_dataset(cfg("cifar10dvs", tmp_path, downsample=4, test_fraction=0.5))
    assert np.array_equal(again.y_train, ds.y_train)  # fixed split


# --------------------------------------------------------------------------- synthetic generator


@pytest.fixture(scope="module")
def digit_images():
    from sklearn.datasets import load_digits

    return load_digits().images[:40] / 16.0


def test_generator_blank_image_gives_no_events():
    events, offsets = se.simulate_saccades(np.zeros((3, 8, 8)))
    assert len(events) == 0 and offsets.tolist() == [0, 0, 0, 0]
    uniform, _ = se.simulate_saccades(np.full((1, 8, 8), 0.7))
    assert len(uniform) > 0  # the square's edges move; its inside does not


def test_generator_event_counts_grow_with_contrast_and_fall_with_threshold(digit_images):
    counts = [np.diff(se.simulate_saccades(a * digit_images)[1]) for a in (0.1, 0.3, 1.0)]
    assert np.all(counts[0] < counts[1]) and np.all(counts[1] < counts[2])
    high = np.diff(se.simulate_saccades(digit_images, contrast_threshold=0.3)[1])
    assert np.all(high < counts[2])


def test_generator_events_are_tonic_format_sorted_and_in_the_sensor(digit_images):
    from tonic.io import events_struct

    events, offsets = se.simulate_saccades(digit_images)
    assert events.dtype == events_struct and set(events.dtype.names) == {"x", "y", "t", "p"}
    w, h, _ = se.SENSOR_SIZE
    assert events["x"].min() >= 0 and events["x"].max() < w and events["y"].min() >= 0 and events["y"].max() < h
    assert events["t"].min() >= 0 and events["t"].max() <= 3 * se.SACCADE_US
    for sample in se.split_events(events, offsets):
        assert np.all(np.diff(sample["t"]) >= 0)
        # Each saccade triangle returns the image to rest, so every pixel ends where it
        # started: it emitted as many ON as OFF events.
        pix = sample["y"].astype(int) * w + sample["x"]
        on = np.bincount(pix[sample["p"]], minlength=w * h)
        off = np.bincount(pix[~sample["p"]], minlength=w * h)
        assert np.array_equal(on, off)


def test_generator_is_deterministic(digit_images):
    a, oa = se.simulate_saccades(digit_images[:10])
    b, ob = se.simulate_saccades(digit_images[:10])
    assert np.array_equal(oa, ob) and a.tobytes() == b.tobytes()
    # A sample's events do not depend on the other samples of the batch.
    c, oc = se.simulate_saccades(digit_images[3:4])
    assert c.tobytes() == a[oa[3]:oa[4]].tobytes()


@pytest.fixture(scope="module")
def digits_events(tmp_path_factory):
    return load_dataset(cfg("digits_events", cache=tmp_path_factory.mktemp("cache"), timesteps=8))


def test_digits_events_dataset(digits_events):
    ds = digits_events
    assert ds.kind == "events" and ds.num_classes == 10 and ds.info["synthetic"] is True
    assert ds.x_train.shape == (1347, 2, 24, 24, 8) and ds.x_test.shape == (450, 2, 24, 24, 8)
    assert ds.x_train.dtype == np.uint8 and set(np.unique(ds.x_test)) == {0, 1}
    # The same fixed stratified split as the `digits` image set.
    digits = load_dataset({"name": "digits"})
    assert np.array_equal(ds.y_train, digits.y_train) and np.array_equal(ds.y_test, digits.y_test)
    assert 3000 < ds.info["events_per_sample_mean"] < 5500
    # Both polarities, every time bin used; a digit is a sparse input.
    assert ds.x_train[:, 0].any() and ds.x_train[:, 1].any()
    assert np.all(ds.x_test.sum(axis=(0, 1, 2, 3)) > 0)
    assert 0.02 < ds.x_test.mean() < 0.4


def test_digits_events_frames_are_the_generator_through_the_pipeline(digits_events):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    images = load_digits().images / 16.0
    _, test_idx = train_test_split(np.arange(len(images)), test_size=0.25,
                                   stratify=load_digits().target, random_state=0)
    events, offsets = se.simulate_saccades(images[test_idx[:2]])
    pipeline = event_frames.EventFrames(se.SENSOR_SIZE, 8)
    for i in range(2):
        assert np.array_equal(digits_events.x_test[i], pipeline(events[offsets[i]:offsets[i + 1]]))


# --------------------------------------------------------------------------- a federated run


def test_fedlec_runs_on_digits_events(tiny_cfg, tmp_path):
    """The example's setting in miniature: FedLEC, #cnum=2, on the synthetic event set."""
    import json

    from neurofed.pipeline import run

    cfg = tiny_cfg(**{"data.name": "digits_events", "data.encoding": "events", "data.downsample": 2,
                      "data.cache": str(tmp_path / "cache"), "partition.scheme": "cnum",
                      "partition.classes_per_client": 2, "algorithm.name": "fedlec"})
    summary = run(cfg, tmp_path / "run", progress=False, after=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and 0.0 <= summary["final_accuracy"] <= 1.0
    assert records[-1]["firing_rate"] > 0
