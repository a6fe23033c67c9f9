//! Matmul dispatch: the plan for one call ([`plan`]: rows function, order, activation layout),
//! its thread split ([`run`]), whole MUL_MAT nodes over strided tensors ([`step`]) and whole
//! MUL_MAT_ID nodes, every selected expert in one call ([`experts`]).

pub mod experts;
pub mod plan;
pub mod run;
pub mod step;
#[cfg(test)]
mod tests;
