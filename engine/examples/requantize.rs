//! Writes a GGUF with every matrix requantized, for trying the kernels on block types no
//! catalog model has:
//!
//!     cargo run --release -p sharemesh-engine --example requantize SRC.gguf DST.gguf TYPE [FALLBACK]
//!
//! TYPE (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F32) for every matrix whose
//! rows it divides; FALLBACK (default Q8_0) for the others, as llama.cpp's presets fall
//! back where a row is not a whole number of 256-element super-blocks.

use candle_core::quantized::GgmlDType;

fn block_type(name: &str) -> Result<(GgmlDType, u32), String> {
    // (type, the general.file_type that names a file of it)
    Ok(match name.to_ascii_uppercase().as_str() {
        "F32" => (GgmlDType::F32, 0),
        "Q4_0" => (GgmlDType::Q4_0, 2),
        "Q4_1" => (GgmlDType::Q4_1, 3),
        "Q8_0" => (GgmlDType::Q8_0, 7),
        "Q5_0" => (GgmlDType::Q5_0, 8),
        "Q5_1" => (GgmlDType::Q5_1, 9),
        "Q4_K" => (GgmlDType::Q4K, 15),
        "Q5_K" => (GgmlDType::Q5K, 17),
        "Q6_K" => (GgmlDType::Q6K, 18),
        other => return Err(format!("unknown block type `{other}`")),
    })
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [src, dst, kind, rest @ ..] = args.as_slice() else {
        return Err("usage: requantize SRC.gguf DST.gguf TYPE [FALLBACK]".into());
    };
    let (wanted, file_type) = block_type(kind)?;
    let (fallback, _) = block_type(rest.first().map_or("Q8_0", String::as_str))?;
    sharemesh_engine::weights::requantize(src.as_ref(), dst.as_ref(), file_type, |_, dims| {
        if dims[1] % wanted.block_size() == 0 {
            wanted
        } else {
            fallback
        }
    })
    .map_err(|e| e.to_string())
}
