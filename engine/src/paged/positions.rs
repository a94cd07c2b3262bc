//! Where each row sits: the rotary angles of its position and the keys its query sees.

use candle_core::{Device, Result, Tensor};
use sharemesh_kernels::llama::LlamaConfig;

/// Additive mask (1, 1, count, start + count): the query at position p sees keys at
/// positions k ≤ p, and on a sliding layer only those with p − k < window (llama.cpp's
/// rule). `None` where nothing is masked (one token, every key inside the window).
pub(super) fn attention_mask(
    start: usize,
    count: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let keys = start + count;
    let slides_out = window.is_some_and(|w| keys > w);
    if count == 1 && !slides_out {
        return Ok(None);
    }
    let mut mask = Vec::with_capacity(count * keys);
    for query in start..start + count {
        for key in 0..keys {
            let visible = key <= query && window.is_none_or(|w| query - key < w);
            mask.push(if visible { 0f32 } else { f32::NEG_INFINITY });
        }
    }
    Tensor::from_vec(mask, (1, 1, count, keys), device).map(Some)
}

/// Each rotary pair's angle per position: `base^(−2i/d)`, divided by the pair's
/// `rope_freqs` factor where the file has them, times the linear `scale`.
pub(super) fn rope_thetas(
    config: &LlamaConfig,
    base: f32,
    factors: Option<Vec<f32>>,
    scale: f32,
) -> Result<Vec<f32>> {
    let dims = config.rope_dimensions;
    if let Some(f) = &factors {
        if f.len() != dims / 2 {
            candle_core::bail!(
                "rope_freqs.weight has {} factors for {} pairs",
                f.len(),
                dims / 2
            );
        }
    }
    Ok((0..dims / 2)
        .map(|pair| {
            let theta = 1f32 / base.powf(2.0 * pair as f32 / dims as f32);
            factors.as_ref().map_or(theta, |f| theta / f[pair]) * scale
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn visible(start: usize, count: usize, window: Option<usize>) -> Vec<Vec<bool>> {
        match attention_mask(start, count, window, &Device::Cpu).unwrap() {
            None => vec![vec![true; start + count]; count],
            Some(mask) => mask
                .squeeze(0)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap()
                .into_iter()
                .map(|row| row.into_iter().map(|v| v == 0.0).collect())
                .collect(),
        }
    }

    #[test]
    fn each_row_sees_the_keys_up_to_its_own_position() {
        assert_eq!(
            visible(2, 2, None),
            [[true, true, true, false], [true, true, true, true]]
        );
        assert!(attention_mask(7, 1, None, &Device::Cpu).unwrap().is_none());
    }

    #[test]
    fn sliding_window_keeps_the_last_window_positions_when_decoding_too() {
        // Window 2: position 3 sees keys 2 and 3 only, in a batch or alone.
        assert_eq!(visible(3, 1, Some(2)), vec![vec![false, false, true, true]]);
        let batch = visible(0, 4, Some(2));
        assert_eq!(batch[3], vec![false, false, true, true]);
        assert_eq!(batch[1], vec![true, true, false, false]);
        // While every key is inside the window, one-token decoding needs no mask.
        assert!(attention_mask(1, 1, Some(2), &Device::Cpu)
            .unwrap()
            .is_none());
    }
}
