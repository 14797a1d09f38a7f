"""Graphs optimized at export and sharing one weights file run as the graphs they came from, with each distinct
tensor stored once and read without a copy, on ONNX Runtime and, in their OpenVINO form, on OpenVINO."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from shared.errors import ModelUnavailable
from shared.models.onnx_runtime import openvino_graph_file, openvino_session, ort_session
from tools.models.onnx_graphs import SHARED_MIN_BYTES, openvino_graphs, optimize_offline, share_weights

RNG = np.random.default_rng(0)
SHARED = RNG.standard_normal((64, 32)).astype(np.float32)  # 8 kB: in the weights file


def linear_graph(path: Path, weight_name: str, bias: np.ndarray) -> Path:
    """y = relu(x @ SHARED + bias): SHARED is the same tensor in every graph (under any name), the bias each
    graph's own."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", weight_name], ["product"]),
            helper.make_node("Add", ["product", "bias"], ["sum"]),
            helper.make_node("Relu", ["sum"], ["y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, bias.shape[0]])],
        [numpy_helper.from_array(SHARED, weight_name), numpy_helper.from_array(bias, "bias")],
    )
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


def test_shared_graphs_give_the_originals_outputs_from_one_copy_of_the_weights(tmp_path: Path) -> None:
    # GIVEN two optimized graphs with one weight in common under two names, and a small bias each
    biases = [RNG.standard_normal(32).astype(np.float32) for _ in range(2)]
    originals = [
        linear_graph(tmp_path / "a.traced", "weight", biases[0]),
        linear_graph(tmp_path / "b.traced", "renamed_weight", biases[1]),
    ]
    inputs = {"x": RNG.standard_normal((3, 64)).astype(np.float32)}
    expected = [ort.InferenceSession(path).run(None, inputs)[0] for path in originals]
    graphs = [tmp_path / "a.onnx", tmp_path / "b.onnx"]
    for original, graph in zip(originals, graphs, strict=True):
        optimize_offline(original, graph)

    # WHEN their large initializers go to one weights file
    weights = tmp_path / "model.weights"
    share_weights(graphs, weights)

    # THEN the common weight is stored once, and the small biases stay in their graphs
    assert SHARED.nbytes >= SHARED_MIN_BYTES > biases[0].nbytes
    assert weights.stat().st_size == SHARED.nbytes
    # AND each graph gives its original's outputs, from the file as the sessions map it
    for graph, outputs in zip(graphs, expected, strict=True):
        session = ort_session(graph, 1, weights)
        np.testing.assert_array_equal(session.run(None, inputs)[0], outputs)


def test_openvino_forms_read_their_constants_from_the_shared_weights_file(tmp_path: Path) -> None:
    # GIVEN two graphs sharing one weights file, as above
    biases = [RNG.standard_normal(32).astype(np.float32) for _ in range(2)]
    graphs = [linear_graph(tmp_path / "a.onnx", "weight", biases[0]), linear_graph(tmp_path / "b.onnx", "w", biases[1])]
    weights = tmp_path / "model.weights"
    stored = share_weights(graphs, weights)
    inputs = {"x": RNG.standard_normal((3, 64)).astype(np.float32)}
    expected = [ort_session(graph, 1, weights).run(None, inputs)[0] for graph in graphs]

    # WHEN their OpenVINO forms are written
    openvino_graphs(graphs, weights, stored)

    # THEN the weights file holds the shared weight still once, and only the small constants are added to it
    assert SHARED.nbytes < weights.stat().st_size < SHARED.nbytes + 2 * 1024
    # AND OpenVINO, given each form's text and the file's bytes, gives the ONNX Runtime outputs within rounding
    for graph, outputs in zip(graphs, expected, strict=True):
        session = openvino_session(openvino_graph_file(graph), weights, 1)
        np.testing.assert_allclose(session.run(None, inputs)[0], outputs, rtol=1e-5, atol=1e-5)


def test_openvino_missing_is_said_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a process where openvino cannot be imported (Lambda's Detect package holds ONNX Runtime only)
    monkeypatch.setitem(sys.modules, "openvino", None)
    # WHEN a graph is to run on OpenVINO
    # THEN the error names the setting and what is missing
    with pytest.raises(ModelUnavailable, match="detector_runtime is openvino, which is not installed here"):
        openvino_session(tmp_path / "a.xml", tmp_path / "a.weights", 1)


def test_a_sessions_threads_leave_the_cores_when_its_run_ends(tmp_path: Path) -> None:
    # GIVEN a session on two threads, and an input large enough for both to work on it
    graph = tmp_path / "linear.onnx"
    optimize_offline(linear_graph(tmp_path / "linear.traced", "weight", np.zeros(32, np.float32)), graph)
    share_weights([graph], tmp_path / "linear.weights")
    session = ort_session(graph, 2, tmp_path / "linear.weights")
    inputs = {"x": RNG.standard_normal((200_000, 64)).astype(np.float32)}
    session.run(None, inputs)
    # WHEN a run ends and the process goes on with something else (here: waits)
    session.run(None, inputs)
    before = time.process_time()
    time.sleep(0.3)
    # THEN the session's threads took no CPU meanwhile (spinning, they took about 35 ms of it): the next step has
    # both cores
    assert time.process_time() - before < 0.01
