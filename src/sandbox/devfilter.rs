//! The cgroup v2 device filter: the fast path's equivalent of runc's eBPF device program.
//! cgroup v2 has no devices files; the kernel asks a `BPF_PROG_TYPE_CGROUP_DEVICE` program
//! attached to the cgroup. The folded rules ([`super::cgroup::fold_devices`]: a default and
//! its exceptions) become a small program: each exception is a test on the device's type,
//! access, major and minor that returns the opposite of the default; nothing matching
//! returns the default.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

const LDX_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const MOV64_REG: u8 = 0xbf;
const MOV64_IMM: u8 = 0xb7;
const AND64_IMM: u8 = 0x57;
const RSH64_IMM: u8 = 0x77;
const JNE_IMM: u8 = 0x55;
const EXIT: u8 = 0x95;

/// A rule as the devices files write it: `c 1:3 rwm`, `b *:* m`, `a *:* rwm`.
#[derive(Debug, PartialEq, Eq)]
struct Rule {
    /// BPF_DEVCG_DEV_BLOCK (1) or BPF_DEVCG_DEV_CHAR (2); `None` for every type.
    kind: Option<i32>,
    major: Option<i32>,
    minor: Option<i32>,
    /// BPF_DEVCG_ACC_MKNOD (1) | READ (2) | WRITE (4).
    access: i32,
}

fn parse(rule: &str) -> Option<Rule> {
    let mut parts = rule.split(' ');
    let kind = match parts.next()? {
        "a" => None,
        "b" => Some(1),
        "c" => Some(2),
        _ => return None,
    };
    let (major, minor) = parts.next()?.split_once(':')?;
    let num = |s: &str| if s == "*" { Some(None) } else { s.parse().ok().map(Some) };
    let access = parts.next()?.chars().try_fold(0, |a, c| match c {
        'm' => Some(a | 1),
        'r' => Some(a | 2),
        'w' => Some(a | 4),
        _ => None,
    })?;
    Some(Rule {
        kind,
        major: num(major)?,
        minor: num(minor)?,
        access,
    })
}

/// The program for `allow_all` and its `exceptions` (rules in the devices-file syntax).
pub fn program(allow_all: bool, exceptions: &[String]) -> Result<Vec<Insn>, String> {
    let mut p = vec![
        insn(LDX_W, 2, 1, 0, 0),     // r2 = ctx->access_type
        insn(MOV64_REG, 3, 2, 0, 0), // r3 = r2 & 0xffff: the device type
        insn(AND64_IMM, 3, 0, 0, 0xffff),
        insn(MOV64_REG, 4, 2, 0, 0), // r4 = r2 >> 16: the access asked for
        insn(RSH64_IMM, 4, 0, 0, 16),
        insn(LDX_W, 5, 1, 4, 0), // r5 = ctx->major
        insn(LDX_W, 6, 1, 8, 0), // r6 = ctx->minor
    ];
    let verdict = |allow: bool| [insn(MOV64_IMM, 0, 0, 0, allow as i32), insn(EXIT, 0, 0, 0, 0)];
    for text in exceptions {
        let r = parse(text).ok_or_else(|| format!("device rule {text:?}"))?;
        let mut tests = Vec::new();
        if let Some(kind) = r.kind {
            tests.push(vec![insn(JNE_IMM, 3, 0, 0, kind)]);
        }
        // Every access asked for must be in the rule's.
        tests.push(vec![
            insn(MOV64_REG, 7, 4, 0, 0),
            insn(AND64_IMM, 7, 0, 0, !r.access & 7),
            insn(JNE_IMM, 7, 0, 0, 0),
        ]);
        if let Some(major) = r.major {
            tests.push(vec![insn(JNE_IMM, 5, 0, 0, major)]);
        }
        if let Some(minor) = r.minor {
            tests.push(vec![insn(JNE_IMM, 6, 0, 0, minor)]);
        }
        let mut block: Vec<Insn> = tests.concat();
        block.extend(verdict(!allow_all));
        // Each failed test jumps past the end of this rule's block.
        let len = block.len();
        for (i, ins) in block.iter_mut().enumerate() {
            if ins.code == JNE_IMM {
                ins.off = (len - i - 1) as i16;
            }
        }
        p.extend(block);
    }
    p.extend(verdict(allow_all));
    Ok(p)
}

fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> std::io::Result<i64> {
    // SAFETY: the attr buffer is 128 zero-padded bytes, larger than what either command reads.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr)) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

/// Loads `program` and attaches it to the cgroup directory `dir` (allowing others, as runc).
pub fn attach(dir: &Path, program: &[Insn]) -> std::io::Result<()> {
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_ATTACH: libc::c_long = 8;
    const BPF_PROG_TYPE_CGROUP_DEVICE: u64 = 15;
    const BPF_CGROUP_DEVICE: u64 = 6;
    const BPF_F_ALLOW_MULTI: u64 = 2;
    let license = c"Apache";
    let mut load = [0u64; 16];
    load[0] = BPF_PROG_TYPE_CGROUP_DEVICE | ((program.len() as u64) << 32);
    load[1] = program.as_ptr() as u64;
    load[2] = license.as_ptr() as u64;
    let raw = bpf(BPF_PROG_LOAD, &mut load)?;
    // SAFETY: the kernel just returned this descriptor for the loaded program.
    let prog = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    let cgroup = std::fs::File::open(dir)?;
    let mut at = [0u64; 16];
    at[0] = cgroup.as_raw_fd() as u64 | ((prog.as_raw_fd() as u64) << 32);
    at[1] = BPF_CGROUP_DEVICE | (BPF_F_ALLOW_MULTI << 32);
    bpf(BPF_PROG_ATTACH, &mut at).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_as_the_devices_files_write_them() {
        let r = parse("c 1:3 rwm").unwrap();
        assert_eq!((r.kind, r.major, r.minor, r.access), (Some(2), Some(1), Some(3), 7));
        let r = parse("b *:* m").unwrap();
        assert_eq!((r.kind, r.major, r.minor, r.access), (Some(1), None, None, 1));
        assert_eq!(parse("c 136:* rw").unwrap().minor, None);
        assert!(parse("x 1:1 r").is_none() && parse("c 1 r").is_none() && parse("c 1:1 q").is_none());
    }

    /// Runs the program on one request, as the kernel would (only the opcodes it uses).
    fn run(p: &[Insn], kind: u32, access: u32, major: u32, minor: u32) -> u64 {
        let ctx = [(access << 16) | kind, major, minor];
        let mut r = [0u64; 11];
        let mut pc = 0;
        loop {
            let i = p[pc];
            let (dst, src) = ((i.regs & 0x0f) as usize, (i.regs >> 4) as usize);
            pc += 1;
            match i.code {
                LDX_W => r[dst] = ctx[(i.off / 4) as usize] as u64,
                MOV64_REG => r[dst] = r[src],
                MOV64_IMM => r[dst] = i.imm as u64,
                AND64_IMM => r[dst] &= i.imm as i64 as u64,
                RSH64_IMM => r[dst] >>= i.imm,
                JNE_IMM if r[dst] != i.imm as i64 as u64 => pc += i.off as usize,
                JNE_IMM => {}
                EXIT => return r[0],
                other => panic!("opcode {other:#x}"),
            }
        }
    }

    #[test]
    fn the_program_allows_exactly_the_exceptions_to_a_deny_default() {
        let rules: Vec<String> = ["c *:* m", "b *:* m", "c 1:3 rwm", "c 136:* rw"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let p = program(false, &rules).unwrap();
        let (block, chr) = (1, 2);
        let (mknod, read, write) = (1, 2, 4);
        assert_eq!(run(&p, chr, read | write, 1, 3), 1, "/dev/null rw");
        assert_eq!(run(&p, chr, read, 1, 5), 0, "/dev/zero is not listed");
        assert_eq!(run(&p, chr, mknod, 1, 5), 1, "mknod of any char device");
        assert_eq!(run(&p, block, mknod, 8, 0), 1, "mknod of any block device");
        assert_eq!(run(&p, block, read, 8, 0), 0, "reading a block device");
        assert_eq!(run(&p, chr, read, 136, 7), 1, "a pty");
        assert_eq!(run(&p, chr, mknod, 136, 7), 1, "mknod of a pty (c *:* m)");
        assert_eq!(
            run(&p, chr, read | write | mknod, 136, 7),
            0,
            "rwm of a pty: m is not in rw"
        );
    }

    #[test]
    fn an_allow_default_denies_only_its_exceptions() {
        let p = program(true, &["c 10:200 rwm".to_string()]).unwrap();
        assert_eq!(run(&p, 2, 2, 10, 200), 0);
        assert_eq!(run(&p, 2, 2, 1, 3), 1);
        assert!(program(true, &["z 1:1 r".to_string()]).is_err());
    }
}
