//! Reading a /proc/kallsyms text: `address kind name [module]` a line.
//! Pure, so it is tested on fixtures.

/// One symbol of the kernel proper or of a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Symbol<'a> {
    pub address: u64,
    pub name: &'a str,
    /// Loaded from a module (`[name]` after the symbol).
    pub in_module: bool,
}

/// Every symbol with a known address: lines that do not parse and the
/// zero addresses shown to readers without the right to see them are left
/// out.
pub fn symbols(text: &str) -> impl Iterator<Item = Symbol<'_>> {
    text.lines().filter_map(|line| {
        let mut parts = line.split_whitespace();
        let (addr, _kind, name) = (parts.next()?, parts.next()?, parts.next()?);
        let address = u64::from_str_radix(addr, 16).ok().filter(|&a| a != 0)?;
        Some(Symbol {
            address,
            name,
            in_module: parts.next().is_some(),
        })
    })
}

/// The address of a symbol of the kernel proper.
pub fn address_of(text: &str, name: &str) -> Option<u64> {
    symbols(text)
        .find(|s| !s.in_module && s.name == name)
        .map(|s| s.address)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = "\
ffffffff81000000 T _stext
ffffffff82a1c008 D page_offset_base
ffffffff82a1c000 D vmemmap_base
0000000000000000 D hidden_from_this_reader
ffffffffc0a01000 t page_offset_base	[some_module]
not a line
";

    #[test]
    fn data_symbols_of_the_kernel_proper() {
        assert_eq!(
            address_of(FIXTURE, "page_offset_base"),
            Some(0xffffffff82a1c008)
        );
        assert_eq!(
            address_of(FIXTURE, "vmemmap_base"),
            Some(0xffffffff82a1c000)
        );
    }

    #[test]
    fn zero_addresses_and_missing_symbols_are_unknown() {
        assert_eq!(address_of(FIXTURE, "hidden_from_this_reader"), None);
        assert_eq!(address_of(FIXTURE, "no_such_symbol"), None);
        assert_eq!(symbols(FIXTURE).count(), 4);
        assert!(symbols(FIXTURE).last().unwrap().in_module);
    }
}
