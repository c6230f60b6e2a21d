static PROG: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));
fn main() {
    let mut ebpf = aya::Ebpf::load(PROG).unwrap();
    for (n, _) in ebpf.programs() { println!("{n}"); }
    let prog: &mut aya::programs::PerfEvent = ebpf.program_mut("pyperch_sample").unwrap().try_into().unwrap();
    prog.load().unwrap();
    println!("loaded");
}
