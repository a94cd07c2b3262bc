//! Byte-level mutations of seed inputs.

use rand::rngs::StdRng;
use rand::Rng;

/// Values that break length and count fields: zero, one, the type's extremes.
const INTERESTING: &[u64] = &[
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0xffff_ffff,
    u64::MAX,
];

/// A mutant of one of `seeds`: one to eight mutations stacked.
pub fn mutant(rng: &mut StdRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut input = if seeds.is_empty() {
        Vec::new()
    } else {
        seeds[rng.random_range(0..seeds.len())].clone()
    };
    for _ in 0..rng.random_range(1..=8) {
        mutate_once(rng, &mut input, seeds);
    }
    input
}

fn mutate_once(rng: &mut StdRng, input: &mut Vec<u8>, seeds: &[Vec<u8>]) {
    let len = input.len();
    match rng.random_range(0..8) {
        0 if len > 0 => {
            let at = rng.random_range(0..len);
            input[at] ^= 1 << rng.random_range(0..8);
        }
        1 if len > 0 => {
            let at = rng.random_range(0..len);
            input[at] = rng.random();
        }
        2 => {
            let at = rng.random_range(0..=len);
            let count = rng.random_range(1..=16);
            let bytes: Vec<u8> = (0..count).map(|_| rng.random()).collect();
            input.splice(at..at, bytes);
        }
        3 if len > 0 => {
            let at = rng.random_range(0..len);
            let end = (at + rng.random_range(1..=16)).min(len);
            input.drain(at..end);
        }
        4 if len > 0 => {
            // An interesting value written over a (little- or big-endian) field.
            let value = INTERESTING[rng.random_range(0..INTERESTING.len())];
            let width = [1usize, 2, 4, 8][rng.random_range(0..4)];
            let at = rng.random_range(0..len);
            let bytes = if rng.random() {
                value.to_le_bytes()
            } else {
                value.to_be_bytes()
            };
            let bytes = if rng.random() {
                &bytes[..width]
            } else {
                &bytes[8 - width..]
            };
            for (i, b) in bytes.iter().enumerate() {
                if let Some(slot) = input.get_mut(at + i) {
                    *slot = *b;
                }
            }
        }
        5 if len > 0 => {
            input.truncate(rng.random_range(0..len));
        }
        6 if !seeds.is_empty() => {
            // Splice: the head of this input, the tail of another seed.
            let other = &seeds[rng.random_range(0..seeds.len())];
            let cut = rng.random_range(0..=len);
            let from = rng.random_range(0..=other.len());
            input.truncate(cut);
            input.extend_from_slice(&other[from..]);
        }
        _ if len > 1 => {
            // Duplicate a run (repeated fields, nested arrays).
            let at = rng.random_range(0..len);
            let end = (at + rng.random_range(1..=32)).min(len);
            let run: Vec<u8> = input[at..end].to_vec();
            input.splice(at..at, run);
        }
        _ => input.push(rng.random()),
    }
}
