//! One `sampler::Sampler` shared by several threads: every batch is
//! delivered exactly once, in step order to each caller, the union equals a
//! single-threaded run's batches, states read meanwhile are positions the
//! stream passed, and the sampler stays usable from one thread afterwards.

use std::sync::{Arc, Barrier};
use std::thread;

use headwater::{Sampler, SamplerConfig, Split};

use crate::support::golden_v1;

const THREADS: usize = 4;

fn cfg() -> SamplerConfig {
    SamplerConfig {
        default_batch_size: 4,
        default_sequence_length: 32,
        num_prefetch: 2,
        ..SamplerConfig::default()
    }
}

/// The first `n` (step, fingerprint) pairs of the train stream from one thread.
fn reference(n: usize) -> Vec<(u64, u64)> {
    let s = Sampler::new(golden_v1(), cfg()).unwrap();
    (0..n)
        .map(|_| {
            let b = s.next_batch(Split::Train).unwrap();
            (b.step, b.fingerprint)
        })
        .collect()
}

/// 4 consumers and an observer (drains metrics, reads states) on one sampler.
fn hammer(want: &[(u64, u64)], per_thread: usize) {
    let total = THREADS * per_thread;
    let s = Arc::new(Sampler::new(golden_v1(), cfg()).unwrap());
    let start = Arc::new(Barrier::new(THREADS + 1));
    let consumers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (s, start) = (s.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                (0..per_thread)
                    .map(|_| {
                        let b = s.next_batch(Split::Train).unwrap();
                        (b.step, b.fingerprint)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let observer = {
        let (s, start, done) = (s.clone(), start.clone(), done.clone());
        thread::spawn(move || {
            start.wait();
            let mut steps = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                s.drain_step_values(Split::Train).unwrap();
                steps.push(s.state().splits["train"].step);
            }
            steps
        })
    };
    let mut all = Vec::new();
    for c in consumers {
        let got = c.join().expect("a consumer failed");
        assert!(
            got.windows(2).all(|w| w[0].0 < w[1].0),
            "a thread got steps out of order: {got:?}"
        );
        all.extend(got);
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let steps = observer.join().unwrap();
    all.sort_unstable();
    assert_eq!(
        all,
        want[..total],
        "the threads' batches are not the stream's, each once"
    );
    assert!(steps.windows(2).all(|w| w[0] <= w[1]) && steps.iter().all(|&x| x <= total as u64));
    assert_eq!(s.state().splits["train"].step, total as u64);
    let next = s.next_batch(Split::Train).unwrap();
    assert_eq!((next.step, next.fingerprint), want[total]);
    s.shutdown();
}

#[test]
fn four_threads_deliver_each_train_batch_once_in_step_order() {
    let per_thread = 60;
    let want = reference(THREADS * per_thread + 1);
    for _ in 0..5 {
        hammer(&want, per_thread);
    }
}
