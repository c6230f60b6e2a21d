//! The Debian mirror this machine's apt is configured with, for debootstrap: the sid root
//! filesystem comes from the same place as the machine's own packages, and no mirror host is
//! written into pyperch.
//!
//! apt reads `/etc/apt/sources.list` (one-line `deb [options] URI SUITE COMPONENT...`), then
//! the `*.list` (one-line) and `*.sources` (deb822 paragraphs) files of
//! `/etc/apt/sources.list.d/` in name order; the first entry that looks like the Debian
//! archive is used.

use std::{fs, path::Path};

/// One `deb` entry of the apt configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub uri: String,
    pub suites: Vec<String>,
    pub components: Vec<String>,
    /// The `Signed-By` keyring (path or inline key), if given.
    pub signed_by: Option<String>,
}

impl Source {
    /// Whether this entry can serve debootstrap for Debian: a main archive (a suite that is
    /// a release, not `-security`/`-updates`/`-backports`, nor a flat `./` repository) with
    /// the `main` component, signed by Debian's archive keyring (what debootstrap checks
    /// against) or apt's default keyrings, over a URI scheme debootstrap understands.
    pub fn is_debian_archive(&self) -> bool {
        let scheme_ok = ["http://", "https://", "file:"].iter().any(|s| self.uri.starts_with(s));
        let release_suite = self.suites.iter().any(|s| !s.contains('-') && !s.contains('/'));
        let main = self.components.iter().any(|c| c == "main");
        let keyring_ok = self.signed_by.as_deref().is_none_or(|k| k.contains("debian-archive-keyring"));
        scheme_ok && release_suite && main && keyring_ok
    }
}

/// Entries of a deb822 `.sources` file (`Types: deb` paragraphs that are not disabled).
pub fn parse_deb822(text: &str) -> Vec<Source> {
    let mut sources = Vec::new();
    for paragraph in paragraphs(text) {
        let field = |name: &str| -> Option<String> {
            paragraph.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone())
        };
        let words = |name: &str| -> Vec<String> {
            field(name).unwrap_or_default().split_whitespace().map(str::to_string).collect()
        };
        if !words("Types").iter().any(|t| t == "deb") {
            continue;
        }
        if field("Enabled").is_some_and(|e| e.trim().eq_ignore_ascii_case("no")) {
            continue;
        }
        for uri in words("URIs") {
            sources.push(Source {
                uri,
                suites: words("Suites"),
                components: words("Components"),
                signed_by: field("Signed-By").map(|s| s.trim().to_string()),
            });
        }
    }
    sources
}

/// The `(field, value)` pairs of each paragraph; continuation lines (starting with white
/// space) are joined to the field before them; `#` lines are comments.
fn paragraphs(text: &str) -> Vec<Vec<(String, String)>> {
    let mut all = Vec::new();
    let mut current: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            if !current.is_empty() {
                all.push(std::mem::take(&mut current));
            }
            continue;
        }
        if line.trim_start().starts_with('#') {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = current.last_mut() {
                value.push('\n');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some((key, value)) = line.split_once(':') {
            current.push((key.trim().to_string(), value.trim().to_string()));
        }
    }
    if !current.is_empty() {
        all.push(current);
    }
    all
}

/// Entries of a one-line `.list` file (`deb` lines; `deb-src` and comments skipped).
pub fn parse_one_line(text: &str) -> Vec<Source> {
    let mut sources = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(rest) = line.strip_prefix("deb ").or_else(|| line.strip_prefix("deb\t")) else { continue };
        let mut rest = rest.trim_start();
        let mut signed_by = None;
        if let Some(after) = rest.strip_prefix('[') {
            let Some((options, tail)) = after.split_once(']') else { continue };
            signed_by = options
                .split_whitespace()
                .find_map(|o| o.strip_prefix("signed-by=").or_else(|| o.strip_prefix("Signed-By=")))
                .map(str::to_string);
            rest = tail.trim_start();
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else { continue };
        sources.push(Source {
            uri: uri.to_string(),
            suites: vec![suite.to_string()],
            components: words.map(str::to_string).collect(),
            signed_by,
        });
    }
    sources
}

/// Every `deb` entry apt would read under `root` (normally `/`), in apt's order.
pub fn configured_sources(root: &Path) -> Vec<Source> {
    let apt = root.join("etc/apt");
    let mut sources = fs::read_to_string(apt.join("sources.list")).map(|t| parse_one_line(&t)).unwrap_or_default();
    let mut files: Vec<_> = fs::read_dir(apt.join("sources.list.d"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else { continue };
        match file.extension().and_then(|e| e.to_str()) {
            Some("list") => sources.extend(parse_one_line(&text)),
            Some("sources") => sources.extend(parse_deb822(&text)),
            _ => {}
        }
    }
    sources
}

/// The URI of the first Debian archive among `sources`.
pub fn debian_mirror(sources: &[Source]) -> Option<String> {
    sources.iter().find(|s| s.is_debian_archive()).map(|s| s.uri.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Host names below are reserved examples (RFC 2606), not real mirrors.
    const DEB822: &str = "\
Types: deb
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

    #[test]
    fn deb822_paragraphs() {
        let sources = parse_deb822(DEB822);
        assert_eq!(sources.len(), 2);
        assert_eq!(sources[0].uri, "http://mirror.example/debian");
        assert_eq!(sources[0].suites, ["bookworm", "bookworm-updates"]);
        assert_eq!(debian_mirror(&sources).as_deref(), Some("http://mirror.example/debian"));
    }

    #[test]
    fn third_party_and_disabled_entries_are_not_debian() {
        let third_party = "\
Types: deb
URIs: https://vendor.example/node_20.x
Suites: nodistro
Components: main
Signed-By: /usr/share/keyrings/vendor.gpg

Types: deb
Enabled: no
URIs: http://disabled.example/debian
Suites: sid
Components: main
";
        assert_eq!(debian_mirror(&parse_deb822(third_party)), None);
        let inline_key = "Types: deb\nURIs: http://x.example/debian\nSuites: sid\nComponents: main\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n";
        assert_eq!(debian_mirror(&parse_deb822(inline_key)), None);
        let security_only = "Types: deb\nURIs: http://x.example/debian-security\nSuites: bookworm-security\nComponents: main\n";
        assert_eq!(debian_mirror(&parse_deb822(security_only)), None);
    }

    #[test]
    fn one_line_entries() {
        let text = "\
# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/vendor.gpg] https://vendor.example/apt cloud-sdk main
deb [arch=amd64] http://mirror.example/debian/ bookworm main contrib # trailing
";
        let sources = parse_one_line(text);
        assert_eq!(sources.len(), 2);
        assert_eq!(sources[0].signed_by.as_deref(), Some("/usr/share/keyrings/vendor.gpg"));
        assert_eq!(sources[1].components, ["main", "contrib"]);
        assert_eq!(debian_mirror(&sources).as_deref(), Some("http://mirror.example/debian/"));
    }

    #[test]
    fn files_in_apt_order() {
        let root = std::env::temp_dir().join(format!("xtask-apt-{}", std::process::id()));
        let dir = root.join("etc/apt/sources.list.d");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("b.sources"), DEB822).unwrap();
        fs::write(dir.join("a.list"), "deb http://first.example/debian trixie main\n").unwrap();
        fs::write(dir.join("c.list.disabled"), "deb http://ignored.example/debian sid main\n").unwrap();
        let sources = configured_sources(&root);
        assert_eq!(sources.len(), 3);
        assert_eq!(debian_mirror(&sources).as_deref(), Some("http://first.example/debian"));
        let _ = fs::remove_dir_all(&root);
    }
}

#[cfg(test)]
mod this_machine {
    /// On a Debian machine set up the standard way, the mirror is found.
    #[test]
    fn a_standard_debian_configuration_is_understood() {
        let root = std::path::Path::new("/");
        if !root.join("etc/debian_version").exists() || !root.join("etc/apt/sources.list.d/debian.sources").exists() {
            return;
        }
        let sources = super::configured_sources(root);
        assert!(super::debian_mirror(&sources).is_some(), "no Debian mirror among {sources:#?}");
    }
}
