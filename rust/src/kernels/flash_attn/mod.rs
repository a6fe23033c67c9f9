//! FLASH_ATTN_EXT for f16 K and V, computed like ggml's CPU backend (`ops.cpp`, one query row
//! at a time, `ggml_compute_forward_flash_attn_ext_f16_one_chunk`):
//!
//! * the q row is rounded to f16 (K's vec_dot type); `s = dot_f16(k, q)` in ggml's lane order;
//! * `s = s·scale`, then `softcap·tanh(s)`, then `+ slope·mask` (rows with mask -inf skipped);
//! * online softmax with the V accumulator in f16 (`VKQ16`): on a new maximum the accumulator is
//!   scaled by `exp(M_old − M)`, then `VKQ16 += v·exp(s − M)`; `S = S·ms + vs` (fused);
//! * sinks are merged after the loop in float32, then the row is scaled by `1/S`.
//!
//! For one query row at one sequence and at least 512 KV positions, ggml splits the KV range
//! into `threads` chunks and merges the chunks' (M, S, VKQ) partials in order
//! (`ggml_flash_attn_ext_reduce_partials`); the result depends on the thread count, so this
//! kernel does the same with its own thread count (the reference's `-t` when they match).
//!
//! All the query rows one thread owns walk the KV positions together, position by position:
//! the K (and V) rows of every KV head at one position are one cache row (2 KiB for 8 heads of
//! 128), read once and in order, where walking one head after another would stride over the
//! whole cache once per head (a decode step's attention at 1792 positions, 16 layers of 16
//! heads: 15.5 -> 10.6 ms on one thread). Each row's operations and their order are unchanged.
//!
//! The cost is proportional to the KV positions the graph passes (`n_kv`), never to the cache.

pub mod params;
pub mod run;
mod tiled;
mod walk;
