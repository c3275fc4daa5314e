"""Writing a model directory's files deterministically: the same input gives the same bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # np.savez stores zip timestamps of "now"; write members in a fixed order with a fixed date instead.
    import io
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key in sorted(arrays):
            buf = io.BytesIO()
            np.save(buf, arrays[key], allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())


def fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    src = onnx.ModelProto()
    src.CopyFrom(model)  # the converter edits its input in place
    # Inputs and outputs stay float32 so the engine feeds both precisions the same way. Resize keeps float32
    # scales (its scales input must be float32); the phase accumulation of HiFT's source (CumSum) needs
    # float32 range over long utterances.
    return convert_float_to_float16(src, keep_io_types=True, disable_shape_infer=True,
                                    op_block_list=[*DEFAULT_OP_BLOCK_LIST, "Resize", "CumSum"])


def save_onnx_sharing_weights(graphs: dict[Path, onnx.ModelProto], weights: Path, min_bytes: int = 1024) -> None:
    """Saves graphs exported from one module (the same weights under other names) with each distinct weight
    stored once, in the external data file `weights` beside them, which ONNX Runtime and onnx.load read
    through each graph. The graphs given are not changed."""
    import hashlib

    from onnx.external_data_helper import set_external_data

    at: dict[bytes, int] = {}
    with weights.open("wb") as f:
        for path, graph in graphs.items():
            model = onnx.ModelProto()
            model.CopyFrom(graph)
            for t in model.graph.initializer:
                if len(t.raw_data) < min_bytes:
                    continue
                key = hashlib.sha256(t.raw_data).digest() + f"{t.data_type}:{list(t.dims)}".encode()
                if key not in at:
                    f.write(b"\0" * (-f.tell() % 4096))  # page-aligned, so the runtime may map it
                    at[key] = f.tell()
                    f.write(t.raw_data)
                set_external_data(t, weights.name, at[key], len(t.raw_data))
                t.ClearField("raw_data")
                t.data_location = onnx.TensorProto.EXTERNAL
            onnx.save(model, str(path))


def save_onnx(model: onnx.ModelProto, path: Path, external: bool) -> None:
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
        # onnx creates the data file 0600: a server running as another (non-root) user could not read it
        (path.parent / (path.name + ".data")).chmod(0o644)
    else:
        onnx.save(model, str(path))
