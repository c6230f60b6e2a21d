//! The workload `cargo xtask test-kernels` profiles in each guest, and the check of pyperch's
//! collapsed output against it: every stack must be one the workload can have, with the
//! right functions and lines, and the deep ones must be whole.
//!
//! The workload recurses `DEPTH` levels (more frames than the kernel reads in full, so the
//! hashed tail and, without `bpf_loop`, its tail calls are exercised) down to a busy leaf.

/// Recursion depth of the workload's `deep`: 1 + DEPTH `deep` frames when the leaf runs.
pub const DEPTH: usize = 400;

/// The workload, a Python source whose line numbers `check` knows (`LINE_*`). It prints
/// `ready` once the recursion has run once, so sampling sees only the steady loop.
pub fn workload() -> String {
    format!(
        "import sys
sys.setrecursionlimit(10000)
def leaf():
    x = 0
    for i in range(20000):
        x += i
    return x
def middle():
    return leaf()
def deep(n):
    if n == 0:
        return middle()
    return deep(n - 1)
def main():
    deep({DEPTH})
    print('ready', flush=True)
    while True:
        deep({DEPTH})
main()
"
    )
}

/// `leaf`'s lines, its `def` line included (a frame that has just started shows it).
const LINE_LEAF: std::ops::RangeInclusive<u32> = 3..=7;
const LINE_MIDDLE_DEF: u32 = 8;
const LINE_MIDDLE: u32 = 9;
const LINE_DEEP_DEF: u32 = 10;
const LINE_DEEP_FIRST: u32 = 11;
const LINE_DEEP_LEAF_CALL: u32 = 12;
const LINE_DEEP_RECURSE: u32 = 13;
const LINE_MAIN_WHILE: u32 = 17;
const LINE_MAIN_LOOP: u32 = 18;
const LINE_MODULE: u32 = 19;

/// What the collapsed output showed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Samples on stacks the workload can have.
    pub valid_samples: u64,
    /// Samples whose stack reached `leaf` through all `1 + DEPTH` `deep` frames.
    pub whole_deep_samples: u64,
    /// The first stack that the workload cannot have, if any.
    pub impossible: Option<String>,
}

/// Checks collapsed lines (`process;frame;frame... COUNT`, frames as `name (file:line)`)
/// against the workload at `file`.
pub fn check(collapsed: &str, file: &str) -> Verdict {
    let mut verdict = Verdict::default();
    for line in collapsed.lines().filter(|l| !l.trim().is_empty()) {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            verdict.impossible.get_or_insert_with(|| line.to_string());
            continue;
        };
        let count: u64 = count.trim().parse().unwrap_or(0);
        // The first element names the process.
        let frames: Vec<&str> = stack.split(';').skip(1).collect();
        match classify(&frames, file) {
            Some(whole) => {
                verdict.valid_samples += count;
                if whole {
                    verdict.whole_deep_samples += count;
                }
            }
            None => {
                verdict.impossible.get_or_insert_with(|| shorten(line));
            }
        }
    }
    verdict
}

/// `Some(whole)` when `frames` (outermost first) is a stack of the steady loop; `whole` when
/// it reaches `middle` or `leaf` (then all `deep` frames must be there).
fn classify(frames: &[&str], file: &str) -> Option<bool> {
    let parsed: Vec<(&str, u32)> = frames.iter().map(|f| parse_frame(f, file)).collect::<Option<_>>()?;
    let mut rest = parsed.as_slice();
    let (&(name, line), below_module) = rest.split_first()?;
    if name != "<module>" || line != LINE_MODULE {
        return None;
    }
    rest = below_module;
    let (&(name, main_line), below_main) = rest.split_first()?;
    if name != "main" || ![LINE_MAIN_WHILE, LINE_MAIN_LOOP].contains(&main_line) {
        return None;
    }
    // Between two calls of `deep`, `main` runs on its own.
    if below_main.is_empty() {
        return Some(false);
    }
    if main_line != LINE_MAIN_LOOP {
        return None;
    }
    rest = below_main;
    let deep = rest.iter().take_while(|(n, _)| *n == "deep").count();
    if deep == 0 || deep > DEPTH + 1 {
        return None;
    }
    let (deeps, tail) = rest.split_at(deep);
    // Every deep frame but the innermost is at the recursive call.
    if deeps[..deep - 1].iter().any(|(_, l)| *l != LINE_DEEP_RECURSE) {
        return None;
    }
    let innermost = deeps[deep - 1].1;
    if ![LINE_DEEP_DEF, LINE_DEEP_FIRST, LINE_DEEP_LEAF_CALL, LINE_DEEP_RECURSE].contains(&innermost) {
        return None;
    }
    if tail.is_empty() {
        return Some(false);
    }
    // Below the innermost `deep`: `middle` (just started, or calling `leaf`), then `leaf`.
    let whole = deep == DEPTH + 1 && innermost == LINE_DEEP_LEAF_CALL;
    let below = match tail {
        [("middle", LINE_MIDDLE_DEF)] => true,
        [("middle", LINE_MIDDLE)] => true,
        [("middle", LINE_MIDDLE), ("leaf", l)] => LINE_LEAF.contains(l),
        _ => false,
    };
    (whole && below).then_some(true)
}

/// `name (file:line)` → (name, line), when the file is the workload's.
fn parse_frame<'a>(frame: &'a str, file: &str) -> Option<(&'a str, u32)> {
    let (name, location) = frame.strip_suffix(')')?.split_once(" (")?;
    let (path, line) = location.rsplit_once(':')?;
    (path == file).then_some(())?;
    Some((name, line.parse().ok()?))
}

fn shorten(line: &str) -> String {
    if line.len() <= 400 {
        return line.to_string();
    }
    let mut end = 400;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &line[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "/w/workload.py";

    fn stack(deep: usize, innermost: u32, tail: &str) -> String {
        let mut s = format!("python3 (pid 1);<module> ({FILE}:19);main ({FILE}:18)");
        for i in 0..deep {
            let line = if i + 1 == deep { innermost } else { 13 };
            s.push_str(&format!(";deep ({FILE}:{line})"));
        }
        s.push_str(tail);
        s
    }

    #[test]
    fn the_workload_has_the_lines_the_check_expects() {
        let source = workload();
        let lines: Vec<&str> = source.lines().collect();
        assert_eq!(lines[LINE_MIDDLE as usize - 1].trim(), "return leaf()");
        assert_eq!(lines[LINE_DEEP_FIRST as usize - 1].trim(), "if n == 0:");
        assert_eq!(lines[LINE_DEEP_LEAF_CALL as usize - 1].trim(), "return middle()");
        assert_eq!(lines[LINE_DEEP_RECURSE as usize - 1].trim(), "return deep(n - 1)");
        assert_eq!(lines[LINE_MAIN_LOOP as usize - 1].trim(), format!("deep({DEPTH})"));
        assert_eq!(lines[LINE_MODULE as usize - 1].trim(), "main()");
    }

    #[test]
    fn whole_and_partial_stacks_pass() {
        let whole = stack(DEPTH + 1, 12, &format!(";middle ({FILE}:9);leaf ({FILE}:6)"));
        let partial = stack(37, 10, "");
        let main_alone = format!("python3 (pid 1);<module> ({FILE}:19);main ({FILE}:17)");
        let v = check(&format!("{whole} 5\n{partial} 2\n{main_alone} 1\n"), FILE);
        assert_eq!(v, Verdict { valid_samples: 8, whole_deep_samples: 5, impossible: None });
    }

    #[test]
    fn a_missing_deep_frame_or_a_wrong_line_fails() {
        let short = stack(DEPTH, 12, &format!(";middle ({FILE}:9);leaf ({FILE}:6)"));
        assert!(check(&format!("{short} 1\n"), FILE).impossible.is_some());
        let wrong_line = stack(DEPTH + 1, 12, &format!(";middle ({FILE}:8);leaf ({FILE}:6)"));
        assert!(check(&format!("{wrong_line} 1\n"), FILE).impossible.is_some());
        let other_file = stack(3, 13, "").replace("main (/w/", "main (/x/");
        assert!(check(&format!("{other_file} 1\n"), FILE).impossible.is_some());
        let while_line_above_deep = stack(3, 13, "").replace(":18)", ":17)");
        assert!(check(&format!("{while_line_above_deep} 1\n"), FILE).impossible.is_some());
        let mid_recursion_line = stack(5, 13, "").replacen(":13)", ":12)", 1);
        assert!(check(&format!("{mid_recursion_line} 1\n"), FILE).impossible.is_some());
    }
}
