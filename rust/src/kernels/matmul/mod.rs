//! Matmul dispatch: the plan for one call ([`plan`]: rows function, order, activation layout),
//! its thread split ([`run`]), and whole MUL_MAT nodes over strided tensors ([`step`]).

pub mod plan;
pub mod run;
pub mod step;
#[cfg(test)]
mod tests;
