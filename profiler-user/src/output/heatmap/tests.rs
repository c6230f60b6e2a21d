use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use crate::sample::aggregate::FrameName;

fn frame(p: &mut Profile, function: &str, file: &str, line: u32) -> crate::sample::aggregate::FrameId {
    p.intern(FrameName { function: Arc::from(function), file: Arc::from(file), line, native: None })
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pyperch-heatmap-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Recursion counts once per stack in a line's total; self goes to the innermost source
/// line; markers and `<...>` files are not source.
#[test]
fn self_and_total_per_line() {
    let mut p = Profile::new();
    let main = frame(&mut p, "main", "/a.py", 10);
    let rec = frame(&mut p, "rec", "/a.py", 20);
    let lib = frame(&mut p, "helper", "/b.py", 3);
    let frozen = frame(&mut p, "_load", "<frozen importlib._bootstrap>", 5);
    let marker = p.try_intern_static(crate::time_mode::GC_FRAME).expect("marker");
    p.add(1, None, &[main, rec, rec, rec], 4);
    p.add(1, None, &[main, rec, lib], 3);
    p.add(2, None, &[main, frozen], 2);
    p.add(2, None, &[main, marker], 1);
    p.add(2, None, &[], 5);
    let c = count(&p);
    assert_eq!(c.total, 15);
    let paths: Vec<&str> = c.files.iter().map(|f| &*f.path).collect();
    assert_eq!(paths, ["/a.py", "/b.py"]);
    let a = &c.files[0];
    assert_eq!((a.self_value, a.total_value), (4 + 2 + 1, 10));
    assert_eq!((a.lines[&10].self_value, a.lines[&10].total_value), (3, 10));
    assert_eq!((a.lines[&20].self_value, a.lines[&20].total_value), (4, 7));
    assert_eq!(a.busiest_pid(), Some(1));
    let b = &c.files[1];
    assert_eq!((b.lines[&3].self_value, b.lines[&3].total_value), (3, 3));
    let selves: u64 = c.files.iter().flat_map(|f| f.lines.values()).map(|l| l.self_value).sum();
    assert!(selves <= c.total);
    assert!(a.lines[&20].functions.contains("rec"));
}

/// Names and source text from the target are escaped; page names are numbered.
#[test]
fn pages_escape_what_the_target_names() {
    let mut p = Profile::new();
    let f = frame(&mut p, "<script>alert(1)</script>", "/t/<img src=x onerror=alert(1)>.py", 2);
    p.add(1, None, &[f], 5);
    let c = count(&p);
    let text = source::Source::Text("a = 1\nb = '</td><script>x()</script>'\n".into());
    let html = page::file_page(&page::FilePage {
        file: &c.files[0],
        total: c.total,
        mode: crate::time_mode::TimeMode::Cpu,
        source: &text,
        root: source::Root::Host,
        pid: 1,
        title: "t\"itle",
        max_lines: usize::MAX,
    })
    .0;
    assert!(!html.contains("<script") && !html.contains("<img"), "{html}");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{html}");
    assert!(html.contains("b = &#39;&lt;/td&gt;&lt;script&gt;"), "{html}");
    assert!(html.contains("data-line=\"2\" data-self=\"5\" data-total=\"5\""), "{html}");
    assert!(html.contains("100.00%"), "{html}");
    let index = page::index_page(&c, &[Some(page_name(0))], crate::time_mode::TimeMode::Cpu, "t", "r");
    assert!(index.contains("<a href=\"file-0001.html\">/t/&lt;img src=x onerror=alert(1)&gt;.py</a>"), "{index}");
    let unreadable = source::Source::Unreadable("it is a FIFO <x>".into());
    let html = page::file_page(&page::FilePage {
        file: &c.files[0],
        total: c.total,
        mode: crate::time_mode::TimeMode::Wall,
        source: &unreadable,
        root: source::Root::Process(1),
        pid: 1,
        title: "t",
        max_lines: usize::MAX,
    })
    .0;
    assert!(html.contains("source not readable: it is a FIFO &lt;x&gt;"), "{html}");
    assert!(html.contains("id=\"L2\""), "a counted line is listed without its source: {html}");
    assert!(html.contains("0.000 s"), "time modes show seconds: {html}");
}

#[test]
fn writes_a_directory_and_refuses_files_and_links() {
    let dir = scratch("dir");
    let src = dir.join("app.py");
    fs::write(&src, "def f():\n    return 1\n").expect("write");
    let mut p = Profile::new();
    let f = frame(&mut p, "f", &src.to_string_lossy(), 2);
    p.add(std::process::id(), None, &[f], 3);
    let out = dir.join("heat");
    write_dir(&p, "title", &out, false).expect("written");
    let index = fs::read_to_string(out.join("index.html")).expect("index");
    assert!(index.contains("href=\"file-0001.html\""), "{index}");
    let page = fs::read_to_string(out.join("file-0001.html")).expect("page");
    assert!(page.contains("    return 1") && page.contains("data-self=\"3\""), "{page}");
    // Again into the existing directory.
    write_dir(&p, "title", &out, false).expect("written again");
    let file = dir.join("regular");
    fs::write(&file, "keep").expect("write");
    let err = write_dir(&p, "t", &file, false).expect_err("a regular file is refused");
    assert!(err.to_string().contains("existing file"), "{err}");
    assert_eq!(fs::read_to_string(&file).expect("read"), "keep");
    std::os::unix::fs::symlink(&out, dir.join("link")).expect("symlink");
    assert!(write_dir(&p, "t", &dir.join("link"), false).is_err());
    // A whole-host heatmap is its owner's only.
    use std::os::unix::fs::PermissionsExt;
    let private = dir.join("private");
    write_dir(&p, "t", &private, true).expect("written");
    let mode = |path: &std::path::Path| fs::metadata(path).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&private) & 0o077, 0, "the directory is private");
    assert_eq!((mode(&private.join("index.html")), mode(&private.join("file-0001.html"))), (0o600, 0o600));
    let _ = fs::remove_dir_all(&dir);
}

/// A relative file name is read against the process's working directory; a page shows at
/// most `max_lines` lines of source, and its counted lines past them.
#[test]
fn relative_paths_and_the_line_budget() {
    let dir = scratch("relative");
    fs::write(dir.join("rel.py"), "a = 1\nb = 2\nc = 3\n").expect("write");
    let mut p = Profile::new();
    let f = frame(&mut p, "f", "rel.py", 3);
    let pid = std::process::id();
    p.set_process(pid, crate::sample::aggregate::ProcessLabel { cwd: Some(dir.to_string_lossy().into_owned()), ..Default::default() });
    p.add(pid, None, &[f], 2);
    let out = dir.join("heat");
    write_dir(&p, "t", &out, false).expect("written");
    let page = fs::read_to_string(out.join("file-0001.html")).expect("page");
    assert!(page.contains("c = 3") && !page.contains("not readable"), "{page}");
    let c = count(&p);
    let text = source::Source::Text("a = 1\nb = 2\nc = 3\n".into());
    let (html, shown) = page::file_page(&page::FilePage {
        file: &c.files[0],
        total: c.total,
        mode: crate::time_mode::TimeMode::Cpu,
        source: &text,
        root: source::Root::Host,
        pid,
        title: "t",
        max_lines: 1,
    });
    assert_eq!(shown, 1);
    assert!(html.contains("a = 1") && !html.contains("b = 2") && html.contains("id=\"L3\""), "{html}");
    assert!(html.contains("only the first 1 lines"), "{html}");
    let _ = fs::remove_dir_all(&dir);
}
