#!/usr/bin/env python3
"""Writes the malformed-file corpus of the saved-tape loader (bad_*.json) from spec.json, the spec's
attention graph as save_tape wrote it (tests/test_tape_file.cpp lists the fault each file must be
refused with). Each file breaks one thing; run from this directory: python3 make_corpus.py"""
import json

lines = open("spec.json").read().splitlines()
header, nodes, footer = lines[0], lines[1:-1], lines[-1]
parsed = [json.loads(n.rstrip(",")) for n in nodes]


def first(op):
    return next(i for i, n in enumerate(parsed) if n.get("op") == op)


def with_node(i, node):
    out = list(nodes)
    out[i] = json.dumps(node, separators=(",", ":")) + ("," if i + 1 < len(nodes) else "")
    return "\n".join([header] + out + [footer]) + "\n"


def write(name, text):
    with open(name, "w") as f:
        f.write(text)


text = "\n".join(lines) + "\n"
matmul, scale = first("matmul"), first("scale")
second_matmul = [i for i, n in enumerate(parsed) if n.get("op") == "matmul"][3]  # A·V: inputs of another shape
write("bad_not_json.json", "tapegrad tape, version 1\n")
write("bad_truncated.json", text[: len(text) // 2])
write("bad_not_an_object.json", "[1, 2, 3]\n")
write("bad_format.json", text.replace('"format": "tapegrad-tape"', '"format": "onnx"'))
write("bad_version.json", text.replace('"version": 1', '"version": 2'))
write("bad_version_text.json", text.replace('"version": 1', '"version": "1"'))
write("bad_version_float.json", text.replace('"version": 1', '"version": 1.0'))
write("bad_scalar.json", text.replace('"scalar": "float64"', '"scalar": "float16"'))
write("bad_unknown_key.json", text.replace('"version": 1', '"version": 1, "comment": "hi"'))
write("bad_no_nodes.json", header + "\n]}\n")
write("bad_output.json", text.replace('"output": %d' % (len(nodes) - 1), '"output": 3'))
write("bad_node_kind.json", with_node(1, dict(parsed[1], node="parameter")))
write("bad_values_count.json", with_node(0, dict(parsed[0], values=parsed[0]["values"][:-1])))
write("bad_value_text.json", with_node(2, dict(parsed[2], values=[parsed[2]["values"][0], "0x1p+0"] + parsed[2]["values"][2:])))
write("bad_value_nan.json", with_node(3, dict(parsed[3], values=["nan"] + parsed[3]["values"][1:])))
write("bad_rank.json", with_node(0, dict(parsed[0], shape=[1] * 9)))
write("bad_dimension.json", with_node(0, dict(parsed[0], shape=[-3, 2])))
write("bad_unknown_op.json", with_node(matmul, dict(parsed[matmul], op="softmax_fast")))
write("bad_input_later.json", with_node(matmul, dict(parsed[matmul], inputs=[0, len(nodes) - 1])))
write("bad_input_count.json", with_node(matmul, dict(parsed[matmul], inputs=[0])))
write("bad_missing_setting.json", with_node(scale, {k: v for k, v in parsed[scale].items() if k != "settings"}))
write("bad_unknown_setting.json", with_node(scale, dict(parsed[scale], settings={"factor": parsed[scale]["settings"]["c"]})))
write("bad_setting_text.json", with_node(scale, dict(parsed[scale], settings={"c": "one half"})))
write("bad_shape_mismatch.json", with_node(second_matmul, dict(parsed[second_matmul], inputs=[0, 0])))
write("bad_declared_shape.json", with_node(matmul, dict(parsed[matmul], shape=list(reversed(parsed[matmul]["shape"])))))
write("bad_label.json", with_node(1, dict(parsed[1], label=7)))

# Faults a JSON tree would hide or could not hold, refused by the loader's first pass.
X = parsed[0]
x_values = json.dumps(X["values"], separators=(",", ":"))
other_values = json.dumps(["1p+1"] * len(X["values"]), separators=(",", ":"))
c_text = json.dumps(parsed[scale]["settings"]["c"])
write("bad_duplicate_root_key.json", text.replace('"version": 1', '"version": 1, "version": 1'))
write("bad_duplicate_values.json", text.replace('"values":' + x_values, '"values":' + x_values + ',"values":' + other_values, 1))
write("bad_duplicate_setting.json", text.replace('"settings":{"c":' + c_text + "}", '"settings":{"c":' + c_text + ',"c":"1p+0"}'))
write("bad_version_zero.json", text.replace('"version": 1', '"version": 0'))
write("bad_version_negative.json", text.replace('"version": 1', '"version": -1'))
write("bad_version_wraps.json", text.replace('"version": 1', '"version": 4294967297'))  # 1 in 32 bits
write("bad_values_too_many.json", with_node(0, dict(X, values=X["values"] + ["1p+0"])))
write("bad_values_before_shape.json", "\n".join(
    [header, '{"node":"leaf","label":"X","values":' + json.dumps(X["values"][:-1], separators=(",", ":")) + ',"shape":[3,2]},']
    + nodes[1:] + [footer]) + "\n")
write("bad_value_not_string.json", with_node(0, dict(X, values=[1] + X["values"][1:])))
write("bad_value_nested.json", with_node(0, dict(X, values=[[[["1p+0"]]]] + X["values"][1:])))
write("bad_too_many_keys.json", with_node(0, dict(X, **{"k%d" % k: k for k in range(13)})))
write("bad_long_shape.json", with_node(0, dict(X, shape=[1] * 65)))

# Found by mutation testing (scripts/mutate; docs/development.md, "Mutation testing"): each file
# kills a mutant the files above let live.
# src/io/tape_document.cpp, the first pass: an object shaped like a node under another root key is
# not a node (that key's own fault is named); every dimension of a rank-4 shape is kept, so the
# value beyond it is refused there; a "values" array that does not fill its shape is refused by the
# first pass, before the second builds anything (here node 1's, although node 0 has a fault only
# the second pass sees).
write("bad_output_node_like.json", text.replace('"output": %d' % (len(nodes) - 1), '"output": [{"inputs": %s}]' % json.dumps([0] * 65)))
write("bad_values_too_many_rank4.json", with_node(0, dict(X, shape=[1, 1, 3, 2], values=X["values"] + ["1p+0"])))
W_Q = parsed[1]
write("bad_values_count_first_pass.json", "\n".join(
    [header, json.dumps(dict(X, label=7), separators=(",", ":")) + ",",
     '{"node":"leaf","label":"W_Q","values":' + json.dumps(W_Q["values"] + ["1p+0"], separators=(",", ":")) + ',"shape":[2,2]},']
    + nodes[2:] + [footer]) + "\n")
# src/io/tape_file.cpp, the second pass: "values" that is not an array, an "op" that is not a
# string, a shape past the element limit (refused with the shape's own message).
write("bad_values_not_array.json", with_node(0, dict(X, values=5)))
write("bad_op_not_string.json", with_node(matmul, dict(parsed[matmul], op=7)))
write("bad_shape_too_large.json", with_node(0, dict(X, shape=[1 << 20, 1 << 20, 2])))
