//! Kernel symbols for `--kernel`, from `/proc/kallsyms` (read once, while pyperch still has
//! the privileges that show real addresses). Bounded: at most `MAX_SYMBOLS` text symbols.

use std::sync::Arc;

/// Most kernel text symbols kept.
const MAX_SYMBOLS: usize = 1_000_000;
/// Largest `/proc/kallsyms` read.
const MAX_BYTES: u64 = 256 << 20;

/// Sorted kernel text symbols.
pub struct Kallsyms {
    symbols: Vec<(u64, Arc<str>)>,
}

impl Kallsyms {
    /// Reads `/proc/kallsyms`; `None` when unreadable or every address is hidden (0).
    pub fn load() -> Option<Kallsyms> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open("/proc/kallsyms").ok()?.take(MAX_BYTES).read_to_string(&mut text).ok()?;
        let k = Self::parse(&text);
        (!k.symbols.is_empty()).then_some(k)
    }

    /// Parses kallsyms text: `address type name [module]`; only text symbols (t/T).
    pub fn parse(text: &str) -> Kallsyms {
        let mut symbols = Vec::new();
        for line in text.lines() {
            if symbols.len() >= MAX_SYMBOLS {
                break;
            }
            let mut parts = line.split_ascii_whitespace();
            let (Some(address), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next()) else { continue };
            if !matches!(kind, "t" | "T") {
                continue;
            }
            let Ok(address) = u64::from_str_radix(address, 16) else { continue };
            if address == 0 {
                continue;
            }
            symbols.push((address, Arc::from(name)));
        }
        symbols.sort_unstable_by_key(|s| s.0);
        Kallsyms { symbols }
    }

    /// The function containing `address` (the nearest symbol at or below it).
    pub fn symbol(&self, address: u64) -> Option<&Arc<str>> {
        let i = self.symbols.partition_point(|s| s.0 <= address);
        Some(&self.symbols.get(i.checked_sub(1)?)?.1)
    }

    /// The function containing `address` and its start address.
    pub fn symbol_at(&self, address: u64) -> Option<(u64, &Arc<str>)> {
        let i = self.symbols.partition_point(|s| s.0 <= address);
        let (start, name) = self.symbols.get(i.checked_sub(1)?)?;
        Some((*start, name))
    }

    /// Lowest and highest symbol addresses (the `[kernel]` mapping of pprof).
    pub fn range(&self) -> Option<(u64, u64)> {
        Some((self.symbols.first()?.0, self.symbols.last()?.0))
    }

    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_enclosing_text_symbol() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 t read_zero\nffffffff81000200 D some_data\n0000000000000000 T hidden\nzz T bad\n",
        );
        assert_eq!(k.len(), 2);
        assert_eq!(k.symbol(0xffffffff81000150).map(|s| &**s), Some("read_zero"));
        assert_eq!(k.symbol(0xffffffff81000000).map(|s| &**s), Some("_stext"));
        assert!(k.symbol(0x1000).is_none());
    }
}
