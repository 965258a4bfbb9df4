"""Accelerate's tree, saving and environment helpers in accel.utils, against Accelerate's
documented behaviour (world size 1; no process is started)."""

from __future__ import annotations

import io
import logging
import os
import pickle
from collections import OrderedDict, UserDict, namedtuple
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import accel.utils
import accel.utils.environment
import accel.utils.operations
import accel.utils.other
from accel import env
from accel.checkpoint.storage import files as ckpt_files
from accel.utils import (
    check_os_kernel,
    clear_environment,
    concatenate,
    convert_dict_to_env_variables,
    convert_outputs_to_fp32,
    convert_to_fp32,
    extract_model_from_parallel,
    find_device,
    get_model_tp_size,
    listify,
    pad_input_tensors,
    purge_accelerate_environment,
    recursively_apply,
    save,
)
from accel.utils.operations import is_namedtuple

Point = namedtuple("Point", "x y")


class Quant(NamedTuple):
    value: torch.Tensor
    scale: torch.Tensor | None


# -- where the names live ----------------------------------------------------------------------


@pytest.mark.parametrize(("path", "names"), [
    ("accel.utils", ("recursively_apply", "concatenate", "convert_to_fp32", "listify", "save",
                     "convert_outputs_to_fp32", "pad_input_tensors", "find_device",
                     "is_namedtuple", "get_model_tp_size", "check_os_kernel",
                     "convert_dict_to_env_variables", "clear_environment",
                     "purge_accelerate_environment", "patch_environment")),
    ("accel.utils.operations", ("recursively_apply", "concatenate", "convert_to_fp32",
                                "convert_outputs_to_fp32", "listify", "pad_input_tensors",
                                "find_device", "is_namedtuple")),
    ("accel.utils.other", ("save", "check_os_kernel", "get_model_tp_size",
                           "patch_environment")),
    ("accel.utils.environment", ("clear_environment", "convert_dict_to_env_variables",
                                 "patch_environment", "purge_accelerate_environment")),
])
def test_the_names_are_at_accelerates_paths(path: str, names: tuple[str, ...]) -> None:
    module = {"accel.utils": accel.utils, "accel.utils.operations": accel.utils.operations,
              "accel.utils.other": accel.utils.other,
              "accel.utils.environment": accel.utils.environment}[path]
    for name in names:
        assert name in dir(module), f"{path}.{name}"
        assert getattr(module, name) is getattr(accel.utils, name)


# -- recursively_apply, is_namedtuple ------------------------------------------------------------


def test_recursively_apply_keeps_containers_and_passes_arguments() -> None:
    data = {"a": [torch.ones(1), (torch.zeros(1), 3)], "p": Point(torch.ones(1), "s")}
    out = recursively_apply(lambda t, k, *, add: t * k + add, data, 2, add=1)
    assert out["a"][0].tolist() == [3.0] and out["a"][1][0].tolist() == [1.0]
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple)
    assert out["a"][1][1] == 3  # other leaves unchanged
    assert isinstance(out["p"], Point) and out["p"].y == "s" and out["p"].x.tolist() == [3.0]
    for mapping in (OrderedDict(x=torch.ones(1)), UserDict(x=torch.ones(1))):
        assert type(recursively_apply(lambda t: t, mapping)) is type(mapping)


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")
def test_recursively_apply_test_type_and_the_error_for_other_types() -> None:
    assert recursively_apply(str.upper, ["a", ("b", 1)], test_type=lambda x: isinstance(x, str)) \
        == ["A", ("B", 1)]
    with pytest.raises(TypeError) as err:
        recursively_apply(torch.tensor, (torch.tensor(1), 1), error_on_other_type=True)
    assert str(err.value) == (  # Accelerate's message, word for word (its tests compare it)
        "Unsupported types (<class 'int'>) passed to `tensor`. Only nested list/tuple/dicts of "
        "objects that are valid for `is_torch_tensor` should be passed.")

    def is_text(value: Any) -> bool:
        return isinstance(value, str)

    with pytest.raises(TypeError, match="valid for `is_text`"):
        recursively_apply(str.upper, ["a", 1], test_type=is_text, error_on_other_type=True)


def test_is_namedtuple() -> None:
    class Sub(Quant):
        pass

    assert is_namedtuple(Point(1, 2)) and is_namedtuple(Quant(torch.ones(1), None))
    assert is_namedtuple(Sub(torch.ones(1), None))
    assert not is_namedtuple((1, 2)) and not is_namedtuple("hey") and not is_namedtuple(object())

    class FieldsOnly(tuple):  # a tuple with _fields but no _asdict is not a namedtuple
        _fields = ("a",)

    assert not is_namedtuple(FieldsOnly((1,)))


# -- concatenate, listify, convert_to_fp32 ------------------------------------------------------


def test_concatenate_nested_batches() -> None:
    a, b = torch.arange(4.0).reshape(2, 2), torch.arange(4.0, 8.0).reshape(2, 2)
    assert torch.equal(concatenate([a, b]), torch.cat([a, b]))
    assert torch.equal(concatenate([a, b], dim=1), torch.cat([a, b], dim=1))
    out = concatenate([{"x": [a, (a,)], "y": b}, {"x": [b, (b,)], "y": a}])
    assert isinstance(out, dict) and isinstance(out["x"], list) and isinstance(out["x"][1], tuple)
    assert out["x"][0].shape == (4, 2) and torch.equal(out["x"][1][0], torch.cat([a, b]))
    assert torch.equal(out["y"], torch.cat([b, a]))
    points = concatenate([Point(a, b), Point(b, a)])
    assert isinstance(points, Point) and points.x.shape == (4, 2)


def test_concatenate_single_batches_and_errors() -> None:
    assert concatenate(["only"]) == "only"  # one batch comes back as it is
    single = torch.ones(3)
    assert torch.equal(concatenate([single]), single)
    with pytest.raises(TypeError, match="can only concatenate tensors"):
        concatenate([{"c": "x"}, {"c": "y"}])
    with pytest.raises(RuntimeError):  # torch.cat: sizes differ off the concatenated dim
        concatenate([torch.ones(2, 3), torch.ones(2, 4)])


def test_listify() -> None:
    assert listify(torch.tensor([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    out = listify({"a": (torch.tensor([0.5], dtype=torch.bfloat16), 7),
                   "b": torch.ones(1, requires_grad=True)})
    assert out == {"a": ([0.5], 7), "b": [1.0]}


def test_convert_to_fp32_only_touches_half_precision() -> None:
    data = {"h": torch.ones(1, dtype=torch.float16), "b": [torch.ones(1, dtype=torch.bfloat16)],
            "d": torch.ones(1, dtype=torch.float64), "i": torch.ones(1, dtype=torch.int64),
            "n": 3}
    out = convert_to_fp32(data)
    assert out["h"].dtype == torch.float32 and out["b"][0].dtype == torch.float32
    assert out["d"] is data["d"] and out["i"] is data["i"] and out["n"] == 3


def test_convert_outputs_to_fp32_and_undoing_it() -> None:
    model = nn.Linear(2, 2)
    original = model.forward
    model.forward = convert_outputs_to_fp32(lambda x: original(x).half())  # type: ignore[method-assign]
    assert model(torch.ones(1, 2)).dtype == torch.float32
    assert callable(model.forward.__wrapped__)  # type: ignore[attr-defined]
    with pytest.raises(pickle.PicklingError, match="unwrap_model"):
        pickle.dumps(model.forward.__wrapped__)  # type: ignore[attr-defined]

    wrapped = nn.Linear(2, 2)
    wrapped.forward = convert_outputs_to_fp32(wrapped.forward)  # type: ignore[method-assign]
    unwrapped = extract_model_from_parallel(wrapped, keep_fp32_wrapper=False)
    assert "forward" not in unwrapped.__dict__  # back to the class's own forward
    pickle.loads(pickle.dumps(unwrapped))


# -- pad_input_tensors, find_device -------------------------------------------------------------


@pytest.mark.parametrize(("batch", "processes", "rows"), [
    (1, 2, 2), (3, 2, 4), (4, 3, 6), (3, 4, 4), (4, 6, 6), (1, 6, 6), (2, 6, 6), (61, 6, 66),
    (8, 4, 8), (12, 4, 12),
])
def test_pad_input_tensors_pads_to_a_multiple_of_the_processes(batch: int, processes: int,
                                                              rows: int) -> None:
    tensor = torch.rand(batch, 4, 4) + 1
    out = pad_input_tensors(tensor, batch, processes)
    assert out.shape == (rows, 4, 4)
    assert torch.equal(out[:batch], tensor) and not out[batch:].any()  # zeros after the batch


def test_pad_input_tensors_nested_dim_and_errors() -> None:
    out = pad_input_tensors({"x": [torch.ones(2, 3)]}, 3, 2, dim=1)
    assert out["x"][0].shape == (2, 4) and out["x"][0][:, 3].tolist() == [0.0, 0.0]
    with pytest.raises(TypeError, match="Unsupported types"):
        pad_input_tensors([torch.ones(1), "x"], 1, 2)
    with pytest.raises(ValueError, match="num_processes must be >= 1"):
        pad_input_tensors(torch.ones(1), 1, 0)
    with pytest.raises(ValueError, match="pass the tensor's own batch size"):
        pad_input_tensors(torch.ones(5), 1, 2)


def test_find_device() -> None:
    cpu = torch.device("cpu")
    assert find_device([1, "a", torch.tensor([1, 2, 3])]) == cpu
    assert find_device({"a": 1, "b": {"c": (torch.ones(1),)}}) == cpu
    assert find_device(torch.ones(1, device="meta")) == torch.device("meta")
    assert find_device([1, "a"]) is None and find_device({}) is None


# -- get_model_tp_size --------------------------------------------------------------------------


def test_get_model_tp_size() -> None:
    model = nn.Linear(1, 1)
    assert get_model_tp_size(model) is None
    model.tp_size = 2  # type: ignore[assignment]  # transformers < 5
    assert get_model_tp_size(model) == 2
    model.tp_size = None  # type: ignore[assignment]  # transformers >= 5: on the config
    model.config = SimpleNamespace(distributed_config=SimpleNamespace(tp_size=4))  # type: ignore[assignment]
    assert get_model_tp_size(model) == 4
    model.config = SimpleNamespace(distributed_config={"tp_size": 8})  # type: ignore[assignment]
    assert get_model_tp_size(model) == 8
    model.config = SimpleNamespace(distributed_config=None)  # type: ignore[assignment]
    assert get_model_tp_size(model) is None


# -- save ---------------------------------------------------------------------------------------


def test_save_torch_format_by_default(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.pt"
    save({"epoch": 3, "w": torch.arange(2)}, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["epoch"] == 3 and loaded["w"].tolist() == [0, 1]
    assert [p.name for p in path.parent.iterdir()] == ["state.pt"]  # no temporary left
    stream = io.BytesIO()
    save({"epoch": 4}, stream)  # an open file, as torch.save takes
    stream.seek(0)
    assert torch.load(stream, weights_only=True) == {"epoch": 4}


def test_save_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    state = OrderedDict(w=torch.ones(2, 2), b=torch.zeros(2))
    save(state, str(path), safe_serialization=True)
    loaded = load_file(str(path))  # a plain safetensors reader
    assert sorted(loaded) == ["b", "w"] and torch.equal(loaded["w"], state["w"])
    with pytest.raises(TypeError, match="pass the file name"):
        save(state, io.BytesIO(), safe_serialization=True)


def test_save_safetensors_reports_shared_tensors(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = self.a

    model = Tied()
    path = tmp_path / "model.safetensors"
    with caplog.at_level(logging.WARNING):
        save(model.state_dict(), path, safe_serialization=True)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Removed shared tensor" in warnings[0].getMessage()
    assert "b.weight" in warnings[0].getMessage()
    assert sorted(load_file(str(path))) == ["a.bias", "a.weight"]  # stored once
    assert sorted(ckpt_files.load(path)) == ["a.bias", "a.weight", "b.bias", "b.weight"]


@pytest.mark.parametrize(("main", "local_main", "on_each_node", "written"), [
    (True, True, False, True), (False, True, False, False),
    (False, True, True, True), (True, False, True, False),
])
def test_save_writes_on_the_main_process_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              main: bool, local_main: bool, on_each_node: bool,
                                              written: bool) -> None:
    import accel.compat.state

    monkeypatch.setattr(accel.compat.state, "PartialState", lambda: SimpleNamespace(
        is_main_process=main, is_local_main_process=local_main))
    path = tmp_path / "x.pt"
    save({"a": 1}, path, save_on_each_node=on_each_node)
    assert path.exists() == written


# -- check_os_kernel ----------------------------------------------------------------------------


@pytest.mark.parametrize(("system", "release", "warns"), [
    ("Linux", "5.4.0-35-generic", True), ("Linux", "5.15.0-35-generic", False),
    ("Linux", "5.5.0", False), ("Darwin", "5.4.0-35-generic", False), ("Linux", "weird", False),
    ("Linux", "4.19.112+", True),
])
def test_check_os_kernel(caplog: pytest.LogCaptureFixture, system: str, release: str,
                         warns: bool) -> None:
    with mock.patch("platform.uname", return_value=mock.Mock(system=system, release=release)), \
            caplog.at_level(logging.WARNING):
        check_os_kernel()
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(records) == int(warns)
    if warns:
        assert release.split("-")[0].rstrip("+") in records[0].msg and "5.5.0" in records[0].msg


# -- environment --------------------------------------------------------------------------------


def test_convert_dict_to_env_variables(caplog: pytest.LogCaptureFixture) -> None:
    variables = {"ACCELERATE_DEBUG_MODE": "1", "BAD_ENV_NAME": "<mything", "OTHER_ENV": "2",
                 "SPACE": "a b", "EMPTY": "", "SEMI;": "x"}
    with caplog.at_level(logging.WARNING, logger="accel.utils.environment"):
        assert convert_dict_to_env_variables(variables) == \
            ["ACCELERATE_DEBUG_MODE=1\n", "OTHER_ENV=2\n"]
    skipped = [r.getMessage() for r in caplog.records if r.name == "accel.utils.environment"]
    assert len(skipped) == 4 and "BAD_ENV_NAME=<mything" in skipped[0]
    with pytest.raises(TypeError, match="str()"):
        convert_dict_to_env_variables({"N": 1})  # type: ignore[dict-item]


def test_clear_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_T_CLEAR", "kept")
    before = dict(os.environ)
    with pytest.raises(RuntimeError), clear_environment():
        assert dict(os.environ) == {}
        os.environ["ACCEL_T_CLEAR"] = "changed"
        os.environ["ACCEL_T_NEW"] = "1"
        raise RuntimeError("boom")
    assert dict(os.environ) == before


def test_purge_a_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_T_OLD", "1")
    monkeypatch.setenv("ACCEL_T_GONE", "2")
    monkeypatch.delenv("OTHER_T_VAR", raising=False)

    @purge_accelerate_environment
    def configure(value: str) -> str:
        os.environ.update(ACCELERATE_T_OLD="changed", ACCELERATE_T_NEW=value,
                          ACCEL_T_NEW=value, OTHER_T_VAR=value)
        del os.environ["ACCEL_T_GONE"]
        return value

    assert configure("x") == "x" and configure.__name__ == "configure"
    assert os.environ["ACCELERATE_T_OLD"] == "1" and os.environ["ACCEL_T_GONE"] == "2"
    assert "ACCELERATE_T_NEW" not in os.environ and "ACCEL_T_NEW" not in os.environ
    assert os.environ.pop("OTHER_T_VAR") == "x"  # other variables are not its business
    with pytest.raises(TypeError, match="decorator"):
        purge_accelerate_environment(3)


def test_purge_a_class_and_its_subclasses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCEL_T_LEAK", raising=False)
    seen: list[str] = []

    @purge_accelerate_environment
    class Base:
        def __init_subclass__(cls, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)
            seen.append(cls.__name__)

        def test_base(self) -> None:
            os.environ["ACCEL_T_LEAK"] = "base"

        @staticmethod
        def test_static() -> str:
            os.environ["ACCEL_T_LEAK"] = "static"
            return "static"

        def helper(self) -> None:  # not a test: left alone
            os.environ["ACCEL_T_LEAK"] = "helper"

    class Child(Base):
        def test_child(self) -> None:
            os.environ["ACCEL_T_LEAK"] = "child"

    assert seen == ["Child"]  # the class's own __init_subclass__ still runs
    child = Child()
    for test in (child.test_base, child.test_child, Child.test_static, Base().test_base):
        test()
        assert "ACCEL_T_LEAK" not in os.environ
    assert Child.test_static() == "static"
    child.helper()
    assert os.environ.pop("ACCEL_T_LEAK") == "helper"


def test_env_preserved_checks_its_prefixes() -> None:
    with pytest.raises(TypeError, match=r"\(prefix,\)"), env.preserved("ACCEL_"):  # type: ignore[arg-type]
        pass


def test_pad_across_processes_leaves_nested_tensors_with_accelerates_warning() -> None:
    from torch.nested import nested_tensor

    from accel.utils import CannotPadNestedTensorWarning, pad_across_processes

    nested = nested_tensor([[1.0, 2.0, 3.0], [1.0]])
    with pytest.warns(CannotPadNestedTensorWarning, match="Cannot pad nested tensors"):
        assert pad_across_processes(nested) is nested
    plain = torch.randn(4, 3)
    assert pad_across_processes(plain, dim=-1) is plain
