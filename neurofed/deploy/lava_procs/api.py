"""The parts of Lava's process API the processes here are made of, loaded once through
:mod:`neurofed.compat` (which makes lava-nc import on Python 3.11)."""

from __future__ import annotations

from neurofed.compat import lava as _lava

process = _lava("lava.magma.core.process.process")
ports = _lava("lava.magma.core.process.ports.ports")
variable = _lava("lava.magma.core.process.variable")
pymodel = _lava("lava.magma.core.model.py.model")
pyports = _lava("lava.magma.core.model.py.ports")
resources = _lava("lava.magma.core.resources")
protocol = _lava("lava.magma.core.sync.protocols.loihi_protocol")
_decorator = _lava("lava.magma.core.decorator")

LavaPyType = _lava("lava.magma.core.model.py.type").LavaPyType
implements, requires, tag = _decorator.implements, _decorator.requires, _decorator.tag
