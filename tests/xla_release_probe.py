"""Runs one torch_xla release's own Python set-up code on worker environments, native parts stubbed.

    python xla_release_probe.py SOURCES SCENARIOS_JSON OUT_JSON

``SOURCES`` holds the release's files as its wheel has them (``torch_xla/...`` and
``entry_points.txt``, see ``scripts/fetch-torch-xla-sources.sh``). For each scenario the
process forgets every torch_xla module, replaces its environment with the scenario's, and
runs, in order, the steps the scenario names:

- ``import``: the parts of ``torch_xla/__init__.py`` that configure a worker: the Neuron
  set-up (``_aws_ec2_inf_trn_init`` and its call) and the registration of the installed PJRT
  plugins, with the release's own plugin entry points.
- ``use_spmd``: ``torch_xla.runtime.use_spmd()``, as :func:`xlarun.init_process_group` calls
  it in a process launched for SPMD that has not switched SPMD on yet.
- ``xla_init``: torch_xla's ``xla://`` rendezvous handler, as ``init_process_group`` runs
  it, up to the store (a recorder stands in for torch's TCPStore).
- ``tpu_version``: ``tpu.version()``, the generation torch_xla reads from the TPU metadata.

What is stubbed: the C++ extension ``_XLAC`` and ``xla_model`` (the runtime answers as the
scenario's ``runtime`` says a correctly configured one would: this process's index among
``processes``, each with ``devices`` devices), ``libneuronxla`` (present for Neuron scenarios), the TPU
metadata server (``requests.get`` serves the scenario's ``metadata``), and torch-neuronx
(absent: the release's own Neuron code runs). Everything else is the release's code. Writes,
per scenario, the environment afterwards, what the rendezvous yielded and any exception.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import json
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
import torch.distributed as dist

FORGET = ("torch_xla", "_XLAC", "libneuronxla", "torch_neuronx")
ALWAYS = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


class PjRtPlugin:
    """Stands in for ``_XLAC.PjRtPlugin``, the base of torch_xla's device plugins."""


def native_extension(cuda_build: bool, world: dict[str, int]) -> types.ModuleType:
    """``_XLAC`` as a runtime of ``world["processes"]`` processes with ``world["devices"]`` devices each
    would answer in process ``world["index"]``, before any device is used."""
    xlac = types.ModuleType("_XLAC")
    index, processes, devices = world["index"], world["processes"], world["devices"]
    answers: dict[str, Callable[..., Any]] = {
        "_xla_runtime_is_initialized": lambda: False,
        "_has_cuda_support": lambda: cuda_build,
        "_register_pjrt_plugin": lambda name, plugin: None,
        "_xla_get_default_device": lambda: "xla:0",
        "_xla_get_default_device_ordinal": lambda: index * devices,
        "_xla_get_device_ordinal": lambda device: index * devices,
        "_xla_set_default_device": lambda device: None,
        "_xla_get_process_index": lambda: index,
        "_xla_get_num_processes": lambda: processes,
        "_xla_get_replication_devices_count": lambda: processes * devices,
        "_xla_get_all_devices": lambda: [f"xla:{ordinal}" for ordinal in range(processes * devices)],
        "_xla_num_devices": lambda: devices,
        "_xla_get_spmd_config_is_locked": lambda: False,
    }
    for name, answer in answers.items():
        setattr(xlac, name, answer)
    xlac.PjRtPlugin = PjRtPlugin  # type: ignore[attr-defined]
    return xlac


def xla_model() -> types.ModuleType:
    """``torch_xla.core.xla_model``, whose device calls go to the runtime."""
    xm = types.ModuleType("torch_xla.core.xla_model")
    xm.get_xla_supported_devices = lambda *args, **kwargs: ["xla:0"]  # type: ignore[attr-defined]
    xm.set_replication = lambda device, devices: None  # type: ignore[attr-defined]
    xm.xla_device = lambda *args, **kwargs: "xla:0"  # type: ignore[attr-defined]
    xm.wait_device_ops = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    return xm


def libneuronxla() -> tuple[types.ModuleType, types.ModuleType]:
    package = types.ModuleType("libneuronxla")
    package.__path__ = []
    package.configure_environment = lambda: None  # type: ignore[attr-defined]
    path = types.ModuleType("libneuronxla.libneuronpjrt_path")
    path.libneuronpjrt_path = lambda: "/opt/neuron/libneuronpjrt.so"  # type: ignore[attr-defined]
    return package, path


class Metadata:
    """The TPU VM metadata server: ``requests.get`` of ``.../instance/attributes/<key>``."""

    def __init__(self, attributes: dict[str, str] | None):
        self.attributes = attributes

    def get(self, url: str, **kwargs: Any) -> Any:
        if self.attributes is None:
            raise requests.ConnectionError(f"no metadata server in this scenario ({url})")
        key = url.rsplit("/", 1)[-1]
        response = requests.models.Response()
        response.status_code = 200 if key in self.attributes else 404
        response._content = self.attributes.get(key, "").encode()
        response.url = url
        return response


class StoreRecorder:
    """Stands in for torch's TCPStore and PrefixStore: records how the rendezvous would build it."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.args = [arg if isinstance(arg, (str, int, bool)) else repr(arg) for arg in args]
        self.kwargs = {key: value for key, value in kwargs.items() if isinstance(value, (str, int, bool))}


class EntryPoints:
    """``importlib.metadata`` as the release's own wheel declares its plugins."""

    def __init__(self, text: str):
        parser = configparser.ConfigParser()
        parser.read_string(text)
        self.plugins = dict(parser["torch_xla.plugins"]) if parser.has_section("torch_xla.plugins") else {}

    def entry_points(self, group: str) -> list[Any]:
        from importlib.metadata import EntryPoint

        return [EntryPoint(name, value, group) for name, value in self.plugins.items()]


def package(name: str, path: Path) -> types.ModuleType:
    """A package whose ``__init__`` is not run (it loads native code); its modules load from ``path``."""
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    sys.modules[name] = module
    return module


def configure_import_code(init_source: str) -> list[ast.stmt]:
    """The statements of ``torch_xla/__init__.py`` that configure a worker, in file order."""
    kept: list[ast.stmt] = []
    for node in ast.parse(init_source).body:
        text = ast.unparse(node)
        if isinstance(node, ast.FunctionDef) and node.name == "_aws_ec2_inf_trn_init":
            kept.append(node)
        elif not isinstance(node, ast.FunctionDef) and (
            "_aws_ec2_inf_trn_init()" in text or "XLA_REGISTER_INSTALLED_PLUGINS" in text
        ):
            kept.append(node)
    return kept


def load_release(sources: Path, scenario: dict[str, Any]) -> dict[str, types.ModuleType]:
    """Fresh torch_xla modules of the release, native parts stubbed as the scenario says."""
    for name in list(sys.modules):
        if name.split(".")[0] in FORGET:
            del sys.modules[name]
    root = sources / "torch_xla"
    torch_xla = package("torch_xla", root)
    xlac = native_extension(
        scenario.get("cuda_build", False), scenario.get("runtime", {"index": 0, "processes": 1, "devices": 1})
    )
    sys.modules["_XLAC"] = xlac
    torch_xla._XLAC = xlac  # type: ignore[attr-defined]
    torch_xla.__version__ = importlib.import_module("torch_xla.version").__version__  # type: ignore[attr-defined]
    torch_xla._found_libtpu = scenario.get("libtpu", False)  # type: ignore[attr-defined]
    torch_xla._found_libneuronxla = scenario.get("libneuronxla", False)  # type: ignore[attr-defined]
    torch_xla.device = lambda *args, **kwargs: "xla:0"  # type: ignore[attr-defined]
    sys.modules["torch_xla.core.xla_model"] = xla_model()
    package("torch_xla.distributed", root / "distributed")
    sys.modules["torch_xla.distributed.xla_backend"] = types.ModuleType("torch_xla.distributed.xla_backend")
    if (root / "experimental").is_dir():
        package("torch_xla.experimental", root / "experimental")
    sys.modules["torch_neuronx"] = None  # type: ignore[assignment]  # absent: torch_xla's own Neuron code runs
    if scenario.get("libneuronxla"):
        sys.modules["libneuronxla"], sys.modules["libneuronxla.libneuronpjrt_path"] = libneuronxla()
    modules = {
        "runtime": importlib.import_module("torch_xla.runtime"),
        "tpu": importlib.import_module("torch_xla._internal.tpu"),
        "rendezvous": importlib.import_module("torch_xla._internal.rendezvous"),
    }
    if (root / "experimental" / "plugins.py").is_file():
        plugins = importlib.import_module("torch_xla.experimental.plugins")
        plugins.importlib_metadata = EntryPoints((sources / "entry_points.txt").read_text())  # type: ignore
        torch_xla.plugins = plugins  # type: ignore[attr-defined]
    return modules


def run_import(sources: Path) -> None:
    torch_xla = sys.modules["torch_xla"]
    code = ast.Module(body=configure_import_code((sources / "torch_xla" / "__init__.py").read_text()), type_ignores=[])
    namespace = torch_xla.__dict__
    namespace.setdefault("__package__", "torch_xla")
    namespace.update(os=os, sys=sys, logging=__import__("logging"))
    exec(compile(code, str(sources / "torch_xla" / "__init__.py"), "exec"), namespace)


def run_scenario(sources: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    os.environ.clear()
    os.environ.update({**ALWAYS, **scenario["env"]})
    result: dict[str, Any] = {}
    requests.get = Metadata(scenario.get("metadata")).get  # type: ignore[assignment]
    dist.TCPStore = StoreRecorder  # type: ignore[misc,assignment]
    dist.PrefixStore = StoreRecorder  # type: ignore[misc,assignment]
    try:
        modules = load_release(sources, scenario)
        runtime = modules["runtime"]
        result["runtime_names"] = sorted(
            name
            for name in ("global_ordinal", "world_size", "process_index", "process_count", "is_spmd", "use_spmd")
            if callable(getattr(runtime, name, None))
        )
        for step in scenario["steps"]:
            if step == "import":
                run_import(sources)
            elif step == "use_spmd":
                runtime.use_spmd()
            elif step == "xla_init":
                store, rank, world = next(modules["rendezvous"].pjrt_rendezvous_handler("xla://"))
                result["rendezvous"] = {"store": vars(store), "rank": rank, "world_size": world}
            elif step == "tpu_version":
                result["tpu_version"] = modules["tpu"].version()
            else:
                raise ValueError(f"unknown step {step}")
    except Exception as error:  # reported to the test, which decides
        result["error"] = f"{type(error).__name__}: {error}"
    result["env"] = dict(os.environ)
    return result


def main() -> None:
    sources, scenarios_path, out_path = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    scenarios = json.loads(scenarios_path.read_text())
    results = {name: run_scenario(sources, scenario) for name, scenario in scenarios.items()}
    out_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
