//! Running generated sequences, and what happens when one fails: the failing sequence is replayed
//! with chunks of steps removed (delta debugging, halving down to single steps) while it still
//! fails, and the report names the seed, the failing step, the shrunk sequence and how to rerun it.

use super::base::Base;
use super::case::Case;
use super::generator::{Gen, Op, Step};
use crate::common::Rng;

// ----- running, reporting and shrinking -----

/// Generates and runs one sequence, recording each step in `log` before it runs.
pub fn run_generated(base: &Base, seed: u64, steps: usize, log: &mut Vec<Step>) {
    let mut r = Rng::new(seed);
    let mut case = Case::new(base);
    case.verify();
    for _ in 0..steps {
        let op = Gen {
            all: case.model.entries(),
            m: &case.model,
            r: &mut r,
            held: case.held.iter().map(|h| h.id).collect(),
        }
        .op(case.held.len());
        let step = Step {
            op,
            forget_seed: r.next(),
        };
        log.push(step.clone());
        case.step(&step);
    }
    // One last unclean and clean reload: everything acknowledged is in the catalog.
    for clean in [false, true] {
        let step = Step {
            op: Op::Reload { clean },
            forget_seed: r.next(),
        };
        log.push(step.clone());
        case.step(&step);
    }
}

pub fn replay(base: &Base, steps: &[Step]) {
    let mut case = Case::new(base);
    case.verify();
    for s in steps {
        case.step(s);
    }
}

pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "(non-string panic)".to_string()
    }
}

pub fn replay_fails(base: &Base, steps: &[Step]) -> Option<String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| replay(base, steps)))
        .err()
        .map(|p| panic_message(&*p))
}

/// Removes steps while the sequence still fails (delta debugging, chunks halving down to one).
pub fn shrink(base: &Base, mut steps: Vec<Step>) -> Vec<Step> {
    let mut chunk = steps.len().div_ceil(2).max(1);
    loop {
        let mut removed = false;
        let mut i = 0;
        while i < steps.len() {
            let mut cand = steps.clone();
            cand.drain(i..(i + chunk).min(steps.len()));
            if replay_fails(base, &cand).is_some() {
                steps = cand;
                removed = true;
            } else {
                i += chunk;
            }
        }
        if chunk == 1 && !removed {
            return steps;
        }
        chunk = (chunk / 2).max(1);
    }
}

pub struct Failure {
    pub seed: u64,
    pub steps: Vec<Step>,
    pub message: String,
}

pub fn report(base: &Base, f: Failure) -> String {
    let at = f.steps.len();
    let last = f
        .steps
        .last()
        .map(|s| format!("{:?}", s.op))
        .unwrap_or_else(|| "(the base, before any step)".to_string());
    let mut out = format!(
        "model test failed: seed {:#x}, step {at} ({last}):\n  {}\nreproduce with \
         OCTOFS_MODEL_SEED={:#x} cargo test --test model\n",
        f.seed, f.message, f.seed
    );
    if std::env::var_os("OCTOFS_MODEL_NO_SHRINK").is_none() {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        // A failure that depends on timing (file timestamps against the clock) may not come back
        // on a replay: then there is nothing to shrink.
        let small = replay_fails(base, &f.steps).map(|_| shrink(base, f.steps.clone()));
        let message = small.as_ref().and_then(|s| replay_fails(base, s));
        std::panic::set_hook(hook);
        match (small, message) {
            (Some(small), Some(message)) => {
                out.push_str(&format!(
                    "shrunk to {} steps (forget seeds kept per step):\n",
                    small.len()
                ));
                for s in &small {
                    out.push_str(&format!("  {s:?}\n"));
                }
                out.push_str(&format!("which fails with: {message}\n"));
            }
            _ => out.push_str(
                "the failure did not come back on a replay (it depends on timing), so it was \
                 not shrunk\n",
            ),
        }
    }
    out
}
