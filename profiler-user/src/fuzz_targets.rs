//! Fuzz targets (proptest, see [`crate::fuzzing`]) for the parsers of target or file input
//! that have none beside them: kernel task-chain records and the asyncio debug offsets
//! (`--async`), the native trailer of a sample record (`--native`), /proc text (status
//! `Threads:`/`NSpid:`, `/proc/locks`, task `stat` and `syscall` for `dump`), text decoded
//! from a target, and `/proc/kallsyms`. Kept in one file so that the parsers' own files stay
//! as they are. Each target: no panic, output bounded by its input and its caps.

use proptest::prelude::*;

use profiler_common::{MAX_TASK_FRAMES, MAX_TASK_LEVELS, Plain, TASK_CHAIN_SIZE, TaskChain, task_chain_status};

use crate::target::asyncio::{MAX_TASK_NAME_CHARS, chain::Chain};
use crate::fuzzing::config;
use crate::target::layout::ObjectLayout;

/// A task-chain record from arbitrary bytes, with status and counts drawn mostly from the
/// plausible ranges (so that the consistency checks are passed often, and the walk runs).
fn chain_record() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), TASK_CHAIN_SIZE..=TASK_CHAIN_SIZE),
        prop_oneof![Just(task_chain_status::COMPLETE), Just(task_chain_status::OVER_BUDGET), any::<u32>()],
        prop_oneof![0u32..=MAX_TASK_LEVELS as u32 + 1, any::<u32>()],
        prop_oneof![0u32..=MAX_TASK_FRAMES as u32 + 1, any::<u32>()],
        prop::collection::vec(prop_oneof![0u16..4, any::<u16>()], MAX_TASK_LEVELS..=MAX_TASK_LEVELS),
        0usize..16,
    )
        .prop_map(|(bytes, status, levels, frames, per_level, cut)| {
            let mut chain = TaskChain::read(&bytes).unwrap_or_else(TaskChain::zeroed);
            chain.status = status;
            chain.n_levels = levels;
            chain.n_frames = frames;
            for (level, n) in chain.levels.iter_mut().zip(per_level) {
                level.n_frames = n;
            }
            let mut out = chain.as_bytes().to_vec();
            // Sometimes a record cut short (the ring buffer gives what the kernel wrote).
            if cut > 12 {
                out.truncate(TASK_CHAIN_SIZE - cut);
            }
            out
        })
}

proptest! {
    #![proptest_config(config(64))]

    /// Kernel task-chain records (`record --async`): consistent records only, a walk within
    /// the record's arrays, names bounded.
    #[test]
    fn fuzz_task_chain_record(bytes in chain_record(), str_type in prop_oneof![Just(None), any::<u64>().prop_map(Some)]) {
        if let Ok(chain) = Chain::parse(&bytes) {
            let levels = chain.levels();
            prop_assert!(!levels.is_empty() && levels.len() <= MAX_TASK_LEVELS);
            let frames: usize = levels.iter().map(|l| l.frames.len()).sum();
            prop_assert!(frames <= MAX_TASK_FRAMES);
            for level in &levels {
                if let Some(name) = level.given_name(&ObjectLayout::TEST_312, str_type) {
                    prop_assert!(name.chars().count() <= MAX_TASK_NAME_CHARS + 1, "{name:?}");
                }
            }
            let _ = (chain.tid(), chain.time_ns(), chain.running());
        }
    }

    /// The asyncio debug-offsets section read from a target (`_AsyncioDebug`).
    #[test]
    fn fuzz_asyncio_offsets(bytes in prop::collection::vec(prop_oneof![0u8..64, any::<u8>()], 0..256)) {
        let _ = crate::target::asyncio::offsets::decode(&bytes);
    }

    /// The native part of a sample record (`--native`): the slices returned lie within it.
    #[test]
    fn fuzz_native_trailer(bytes in prop::collection::vec(prop_oneof![0u8..8, any::<u8>()], 0..2048)) {
        if let Some((_, kernel, user)) = crate::target::native::parse_native(&bytes) {
            prop_assert!(kernel.len() + user.len() <= bytes.len());
        }
    }

    /// /proc/PID/status: the thread count and the namespace pids.
    #[test]
    fn fuzz_proc_status(lines in prop::collection::vec(status_line(), 0..12)) {
        let text = lines.join("\n");
        let _ = crate::target::discovery::procfs::parse_status_threads(&text);
        let pids = crate::host::containers::parse_nspid(&text);
        prop_assert!(pids.len() <= text.len());
    }

    /// /proc/locks: write leases, never more files than lines.
    #[test]
    fn fuzz_proc_locks(lines in prop::collection::vec(locks_line(), 0..12)) {
        let text = lines.join("\n");
        let leased = crate::target::discovery::leases::parse_write_leases(&text);
        prop_assert!(leased.len() <= lines.len());
    }

    /// /proc/PID/task/TID/stat and .../syscall for `dump`.
    #[test]
    fn fuzz_dump_task_text(stat in stat_text(), syscall in syscall_text()) {
        let state = crate::target::thread_stacks::proc_threads::parse_state_and_start(&stat);
        let call = crate::target::thread_stacks::proc_threads::parse_syscall(&syscall);
        if let Some((state, _)) = state {
            let _ = crate::target::thread_stacks::proc_threads::classify(state, call);
        }
    }

    /// Text bytes from a target: valid UTF-8 kept, every invalid byte as `\xNN`.
    #[test]
    fn fuzz_text_decode(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let text = crate::text::decode(&bytes);
        prop_assert!(text.len() <= 4 * bytes.len());
        if let Ok(valid) = std::str::from_utf8(&bytes) {
            prop_assert_eq!(text.as_str(), valid);
        }
    }

    /// /proc/kallsyms (`--kernel`): lookups within what was parsed.
    #[test]
    fn fuzz_kallsyms(lines in prop::collection::vec(kallsyms_line(), 0..16), probes in prop::collection::vec(any::<u64>(), 1..8)) {
        let symbols = crate::target::native::kallsyms::Kallsyms::parse(&lines.join("\n"));
        prop_assert!(symbols.len() <= lines.len());
        for address in probes {
            let _ = symbols.symbol(address);
        }
    }
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u32>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        Just("-1".to_string()),
        Just("99999999999999999999999".to_string()),
        "[0-9a-fx+-]{0,12}",
    ]
}

fn status_line() -> impl Strategy<Value = String> {
    prop_oneof![
        number().prop_map(|n| format!("Threads:\t{n}")),
        prop::collection::vec(number(), 0..6).prop_map(|ns| format!("NSpid:\t{}", ns.join("\t"))),
        "[ -~\t]{0,40}",
    ]
}

fn locks_line() -> impl Strategy<Value = String> {
    let class = prop_oneof![Just("LEASE"), Just("DELEG"), Just("POSIX"), Just("FLOCK")];
    let kind = prop_oneof![Just("WRITE"), Just("READ"), Just("UNLCK")];
    let file = prop_oneof![
        (any::<u32>(), any::<u32>(), number()).prop_map(|(a, b, i)| format!("{a:x}:{b:x}:{i}")),
        "[0-9a-f:]{0,24}",
    ];
    prop_oneof![
        (number(), class, kind, number(), file).prop_map(|(id, c, k, pid, f)| format!("{id}: {c}  ACTIVE    {k} {pid} {f} 0 EOF")),
        "[ -~]{0,60}",
    ]
}

fn stat_text() -> impl Strategy<Value = String> {
    prop_oneof![
        ("[ -~()]{0,20}", "[A-Za-z]", prop::collection::vec(number(), 0..24))
            .prop_map(|(comm, state, rest)| format!("123 ({comm}) {state} {}", rest.join(" "))),
        "[ -~]{0,80}",
    ]
}

fn syscall_text() -> impl Strategy<Value = String> {
    prop_oneof![
        (number(), prop::collection::vec(any::<u64>(), 0..8))
            .prop_map(|(nr, args)| format!("{nr} {}", args.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>().join(" "))),
        Just("running".to_string()),
        "[ -~]{0,60}",
    ]
}

fn kallsyms_line() -> impl Strategy<Value = String> {
    prop_oneof![
        (any::<u64>(), "[tTdDbBwW]", "[a-z_.0-9]{0,20}", prop_oneof![Just(""), Just("\t[mod]")])
            .prop_map(|(a, t, n, m)| format!("{a:016x} {t} {n}{m}")),
        "[ -~\t]{0,50}",
    ]
}
