//! Every command the README and `docs/*.md` show is run (issue #32, "a front door and a guide").
//!
//! Every line of a fenced code block in README.md and docs/*.md that is a `pyperch ...`
//! command (after an optional `$ `, `sudo ` and `NAME=value` environment words, with `\`
//! continuations joined and a trailing `# comment` dropped) is taken as shown. Each one is
//! run for real, against a busy Python workload, after the substitutions of [`SUBSTITUTIONS`]
//! (placeholders such as `PID`, `app.py` or a URL become a live pid, a real script, a local
//! address that refuses connections) and, when it would otherwise run until Ctrl-C, with
//! `--duration 3` added. It must exit with status 0 (so clap accepted its arguments), and
//! every output file it names must exist and be non-empty; the front door's SVG must also be a
//! flame graph holding the script's function. Usage synopses (`pyperch record [--pid PID]...`)
//! are not run: each `--flag` they name must be in that subcommand's `--help`. A shown line
//! that is not a command (a screen of `pyperch top`) is listed in [`NOT_COMMANDS`] with the
//! reason; a new one fails the test until it is runnable or listed.
//!
//! `cargo xtask ...` commands are not run here (the suite itself runs `cargo xtask test`, and
//! the others take minutes to hours); each subcommand they name must exist in
//! `xtask/src/main.rs`'s `enum Cmd`, or be listed in [`XTASK_PENDING`] with the reason.
//! Lines that run `cargo xtask` behind environment words (`RUST_LOG=... cargo xtask run`) count
//! as `cargo xtask` commands.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use pyperch_tests::*;

const HOST_PREFERENCE: [&str; 6] = ["3.12", "3.11", "3.13", "3.10", "3.9", "3.8"];

/// What a shown word becomes when the command is run: `{pid}` is the busy workload's pid,
/// `{python}` the host interpreter, `{app}` a 2-second script whose function is `app_busy`,
/// `{dir}` the scratch directory the command runs in.
const SUBSTITUTIONS: &[(&str, &str, &str)] = &[
    ("PID", "{pid}", "the process to profile: a busy workload"),
    ("24520", "{pid}", "dump's example pid: the busy workload"),
    ("python3", "{python}", "the host interpreter the tests use (not a pyenv shim)"),
    ("app.py", "{app}", "a real program that runs 2 s and exits 0"),
    ("https://pyroscope.example.com", "https://127.0.0.1:9", "a local address that refuses connections (uploads fail, the agent runs)"),
    ("https://profiles-prod-001.grafana.net", "https://127.0.0.1:9", "a local address that refuses connections"),
    ("http://collector:4318", "http://127.0.0.1:9", "a local address that refuses connections"),
    ("/etc/pyperch/ca.pem", "/etc/ssl/certs/ca-certificates.crt", "a real CA bundle"),
    ("/etc/pyperch/password", "{dir}/password", "a password file the test writes"),
    ("$(cat token)", "docs-test-token", "the token's text"),
    ("10", "2", "`--duration 10` shortened to 2 s (only as the value of --duration)"),
];

/// Shown lines that start like a command but are not one, with the reason.
const NOT_COMMANDS: &[(&str, &str)] = &[("pyperch top - ", "the first line of a screen of `pyperch top`, not a command")];

/// `cargo xtask` subcommands the docs name that are not in this branch's `enum Cmd`, with the reason.
/// (None today: `cargo xtask wheel`, once pending, is in.)
const XTASK_PENDING: &[(&str, &str)] = &[];

struct Shown {
    place: String,
    line: String,
}

impl Shown {
    /// The environment words and the command's own words.
    fn parts(&self) -> (Vec<(String, String)>, Vec<String>) {
        split_env(&words(&self.line))
    }

    fn is_xtask(&self) -> bool {
        self.parts().1.starts_with(&["cargo".to_string(), "xtask".to_string()])
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// Shell-like words: spaces split, double quotes group (and are dropped).
fn words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            c => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Every fenced-block line that is a `pyperch` or `cargo xtask` command, continuations joined.
fn shown_lines() -> Vec<Shown> {
    let mut out = Vec::new();
    for file in doc_files() {
        let text = fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(repo_root()).unwrap().display().to_string();
        let (mut fenced, mut pending): (bool, Option<(usize, String)>) = (false, None);
        let mut synopsis: Option<usize> = None;
        for (i, raw) in text.lines().enumerate() {
            if raw.trim_start().starts_with("```") {
                fenced = !fenced;
                synopsis = None;
                continue;
            }
            if !fenced {
                continue;
            }
            // A synopsis goes on over indented lines of `[--flag ...]`.
            if let Some(at) = synopsis {
                if raw.starts_with(' ') && raw.trim_start().starts_with(['[', '-']) {
                    let shown: &mut Shown = &mut out[at];
                    shown.line = format!("{} {}", shown.line, raw.trim());
                    continue;
                }
                synopsis = None;
            }
            let (start, mut line) = match pending.take() {
                Some((start, head)) => (start, format!("{head} {}", raw.trim())),
                None => (i + 1, raw.trim().to_string()),
            };
            if let Some(head) = line.strip_suffix('\\') {
                pending = Some((start, head.trim_end().to_string()));
                continue;
            }
            if let Some(at) = line.find(" #") {
                line.truncate(at);
            }
            let line = line.trim().to_string();
            let (_, cmd) = split_env(&words(&line));
            if cmd.first().is_some_and(|w| w == "pyperch") || cmd.starts_with(&["cargo".into(), "xtask".into()]) {
                if line.contains('[') {
                    synopsis = Some(out.len());
                }
                out.push(Shown { place: format!("{name}:{start}"), line });
            }
        }
    }
    out
}

/// `($, sudo, NAME=value...)` dropped: the environment and the command's words.
fn split_env(words: &[String]) -> (Vec<(String, String)>, Vec<String>) {
    let mut env = Vec::new();
    let mut rest = words;
    while let Some((first, tail)) = rest.split_first() {
        if first == "$" || first == "sudo" {
            rest = tail;
        } else if let Some((k, v)) = first.split_once('=').filter(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_')) {
            env.push((k.to_string(), v.to_string()));
            rest = tail;
        } else {
            break;
        }
    }
    (env, rest.to_vec())
}

fn substitute(word: &str, prev: Option<&str>, vars: &[(&str, String)]) -> String {
    for (shown, run, _) in SUBSTITUTIONS {
        if word == *shown && (*shown != "10" || prev == Some("--duration")) {
            let mut s = run.to_string();
            for (k, v) in vars {
                s = s.replace(k, v);
            }
            return s;
        }
    }
    word.to_string()
}

fn xtask_subcommands() -> BTreeSet<String> {
    let main = fs::read_to_string(repo_root().join("xtask/src/main.rs")).expect("xtask/src/main.rs");
    let body = &main[main.find("enum Cmd {").expect("xtask/src/main.rs has no `enum Cmd`")..];
    let body = &body[..body.find("\n}").unwrap()];
    let mut names = BTreeSet::new();
    for line in body.lines() {
        let t = line.trim();
        let ident: String = t.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        if line.starts_with("    ") && !line.starts_with("     ") && ident.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
            let mut kebab = String::new();
            for (i, c) in ident.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    kebab.push('-');
                }
                kebab.push(c.to_ascii_lowercase());
            }
            names.insert(kebab);
        }
    }
    names
}

#[test]
fn docs_xtask_subcommands_exist() {
    let known = xtask_subcommands();
    note(format!("xtask subcommands: {known:?}"));
    let shown = shown_lines();
    let mut checked = 0;
    for s in shown.iter().filter(|s| s.is_xtask()) {
        let sub = s.parts().1.get(2).cloned().unwrap_or_default();
        if let Some((_, why)) = XTASK_PENDING.iter().find(|(p, _)| *p == sub) {
            if known.contains(&sub) {
                note(format!("{}: `cargo xtask {sub}` exists now; its XTASK_PENDING entry can go", s.place));
            } else {
                note(format!("{}: `cargo xtask {sub}` not checked: {why}", s.place));
            }
            continue;
        }
        assert!(known.contains(&sub), "{}: `{}` names `cargo xtask {sub}`, which xtask/src/main.rs does not define.", s.place, s.line);
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} `cargo xtask` commands were found in the docs, so the extraction is broken.");
}

#[test]
fn docs_synopses_name_real_flags() {
    let mut checked = 0;
    for s in shown_lines().iter().filter(|s| !s.is_xtask() && s.line.contains('[')) {
        let sub = s.parts().1[1].clone();
        let help = pyperch(&[&sub, "--help"], Duration::from_secs(30));
        assert!(help.success(), "{}: `pyperch {sub} --help` failed: {}", s.place, help.diag());
        for w in words(&s.line) {
            for part in w.trim_matches(|c| c == '[' || c == ']' || c == '.').split('|') {
                let flag = part.trim_matches(|c| c == '[' || c == ']' || c == '.');
                if flag.starts_with("--") && flag.len() > 2 {
                    assert!(help.stdout.contains(flag), "{}: the synopsis of `pyperch {sub}` names {flag}, which its --help does not list.", s.place);
                    checked += 1;
                }
            }
        }
    }
    note(format!("{checked} synopsis flags found in --help"));
    assert!(checked >= 20, "only {checked} synopsis flags were found in the docs, so the extraction is broken.");
}

#[test]
fn docs_pyperch_commands_run() {
    if !is_root() {
        skip("docs_commands needs root (eBPF)");
        return;
    }
    let Some(py) = first_python(&HOST_PREFERENCE) else {
        skip("no host Python to run the documented commands against");
        return;
    };
    let mut busy = Workload::spawn(&py, "peer_busy.py", &["300"]).expect("the busy workload did not start");
    let dir = std::env::temp_dir().join("pyperch-tests").join(format!("docs-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("password"), "docs-test-password\n").unwrap();
    let app = dir.join("app.py");
    fs::write(
        &app,
        "import time\n\ndef app_busy(seconds):\n    end = time.monotonic() + seconds\n    x = 0\n    while time.monotonic() < end:\n        x = (x + 1) % 65521\n    return x\n\napp_busy(2)\n",
    )
    .unwrap();
    let vars: Vec<(&str, String)> = vec![
        ("{pid}", busy.pid.to_string()),
        ("{python}", py.exe.display().to_string()),
        ("{app}", app.display().to_string()),
        ("{dir}", dir.display().to_string()),
    ];

    let mut seen = BTreeSet::new();
    let mut ran = 0;
    for s in shown_lines().iter().filter(|s| !s.is_xtask()) {
        if let Some((_, why)) = NOT_COMMANDS.iter().find(|(p, _)| s.line.starts_with(p)) {
            note(format!("{}: not run ({why}): {}", s.place, s.line));
            continue;
        }
        if s.line.contains('[') {
            continue; // a synopsis: docs_synopses_name_real_flags
        }
        if !seen.insert(s.line.clone()) {
            continue;
        }
        let (env, shown) = s.parts();
        let mut args: Vec<String> = Vec::new();
        for (i, w) in shown.iter().enumerate().skip(1) {
            args.push(substitute(w, if i > 1 { Some(&shown[i - 1]) } else { None }, &vars));
        }
        let sub = args[0].clone();
        let launches = args.iter().any(|a| a == "--");
        if matches!(sub.as_str(), "record" | "agent") && !launches && !args.iter().any(|a| a == "--duration" || a == "-d") {
            args.push("--duration".into());
            args.push("3".into());
        }
        let outputs: Vec<PathBuf> = args
            .windows(2)
            .filter(|w| w[0] == "-o" || w[0] == "--output")
            .map(|w| dir.join(&w[1]))
            .collect();
        for o in &outputs {
            let _ = fs::remove_file(o);
            let _ = fs::remove_dir_all(o);
        }
        let mut cmd = Command::new(pyperch_bin());
        cmd.args(&args).current_dir(&dir);
        for (k, v) in &env {
            cmd.env(k, substitute(v, None, &vars));
        }
        note(format!("{}: pyperch {}", s.place, args.join(" ")));
        let run = Running::start(cmd).expect("cannot start pyperch").finish(Duration::from_secs(90));
        assert!(
            !run.stderr.contains("unexpected argument") && run.code() != Some(2),
            "{}: `{}` is rejected by pyperch's argument parser: {}",
            s.place,
            s.line,
            run.diag()
        );
        assert!(run.success(), "{}: `{}` did not exit with status 0: {}", s.place, s.line, run.diag());
        for o in &outputs {
            // A file must hold bytes; a directory (`--format heatmap -o DIR`) must hold files.
            let filled = match fs::metadata(o) {
                Ok(m) if m.is_dir() => fs::read_dir(o).map(|mut d| d.next().is_some()).unwrap_or(false),
                Ok(m) => m.len() > 0,
                Err(_) => false,
            };
            assert!(filled, "{}: `{}` left no output in {}.", s.place, s.line, o.display());
        }
        if s.place.starts_with("README.md") && args.iter().any(|a| a == "--") {
            let svg = fs::read_to_string(&outputs[0]).unwrap();
            assert!(
                svg.contains("<svg") && svg.contains("</svg>") && svg.contains("app_busy"),
                "{}: the front door's flame graph is not an SVG holding app_busy.",
                s.place
            );
        }
        ran += 1;
    }
    note(format!("{ran} documented pyperch commands ran"));
    assert!(ran >= 6, "only {ran} documented pyperch commands were found, so the extraction is broken.");
    busy.terminate();
    let _ = fs::remove_dir_all(&dir);
}
