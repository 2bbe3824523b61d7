/**
 * Measuring from /proc, for every bench: a process's resident memory, its CPU time (and its descendants', or a
 * named set of processes' between two snapshots), the CPU of reaped children, the open-file limit. Linux only, as
 * the benches are.
 */
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';

/** VmRSS of a process, KiB. */
export async function rssKiB(pid: number | 'self'): Promise<number> {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(await readFile(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no VmRSS in /proc/${pid}/status`);
  return Number(m[1]);
}

export const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

/** pid and every descendant (sshd forks per connection, ssh runs its ProxyCommand as a child). */
export function processTree(pid: number): number[] {
  const out = [pid];
  try {
    for (const task of readdirSync(`/proc/${pid}/task`)) {
      const children = readFileSync(`/proc/${pid}/task/${task}/children`, 'utf8').trim();
      if (children) for (const c of children.split(/\s+/)) out.push(...processTree(Number(c)));
    }
  } catch {
    // gone
  }
  return out;
}

/** CPU seconds (user + system) used so far by a process (not its children). */
export function cpuSeconds(pid: number | 'self'): number {
  if (pid === 'self') {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1e6;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLK_TCK; // utime, stime (fields 14 and 15)
  } catch {
    return 0;
  }
}

/** User and system CPU seconds of a process so far, all its threads, and of its main thread alone (tid = pid). */
export interface CpuSplit {
  user: number;
  sys: number;
  mainUser: number;
  mainSys: number;
}

function userSys(statPath: string): [number, number] {
  try {
    const stat = readFileSync(statPath, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return [Number(fields[11]) / CLK_TCK, Number(fields[12]) / CLK_TCK];
  } catch {
    return [0, 0]; // gone
  }
}

/** A process's read and write syscalls so far (all threads; sockets and pipes count too): /proc/<pid>/io. */
export interface SyscallIo {
  reads: number;
  writes: number;
  readBytes: number;
  writeBytes: number;
}

export function syscallIo(pid: number): SyscallIo {
  try {
    const f = Object.fromEntries(readFileSync(`/proc/${pid}/io`, 'utf8').trim().split('\n').map((l) => l.split(/:\s*/) as [string, string]));
    return { reads: Number(f.syscr), writes: Number(f.syscw), readBytes: Number(f.rchar), writeBytes: Number(f.wchar) };
  } catch {
    return { reads: 0, writes: 0, readBytes: 0, writeBytes: 0 }; // gone, or not ours to read
  }
}

/** b - a, field by field. */
export function ioDelta(a: SyscallIo, b: SyscallIo): SyscallIo {
  return { reads: b.reads - a.reads, writes: b.writes - a.writes, readBytes: b.readBytes - a.readBytes, writeBytes: b.writeBytes - a.writeBytes };
}

/** The split of several processes together (their main threads summed). */
export function cpuSplit(pids: number[]): CpuSplit {
  const out: CpuSplit = { user: 0, sys: 0, mainUser: 0, mainSys: 0 };
  for (const pid of pids) {
    const [u, s] = userSys(`/proc/${pid}/stat`);
    const [mu, ms] = userSys(`/proc/${pid}/task/${pid}/stat`);
    out.user += u;
    out.sys += s;
    out.mainUser += mu;
    out.mainSys += ms;
  }
  return out;
}

/** b - a, field by field. */
export function splitDelta(a: CpuSplit, b: CpuSplit): CpuSplit {
  return { user: b.user - a.user, sys: b.sys - a.sys, mainUser: b.mainUser - a.mainUser, mainSys: b.mainSys - a.mainSys };
}

/** Named components of a path, each the pids to read now ('self': this process). */
export type CpuProbe = Record<string, () => number[] | 'self'>;

/** CPU seconds per named component between two snapshots (process trees re-read at each snapshot). */
export function cpuSnapshot(probe: CpuProbe): Map<string, Map<number | 'self', number>> {
  const snap = new Map<string, Map<number | 'self', number>>();
  for (const [name, pids] of Object.entries(probe)) {
    const list = pids();
    const m = new Map<number | 'self', number>();
    for (const pid of list === 'self' ? (['self'] as const) : list) m.set(pid, cpuSeconds(pid));
    snap.set(name, m);
  }
  return snap;
}

/** CPU seconds per component used since the snapshot `before` (the probe's processes read again). */
export function cpuDelta(before: ReturnType<typeof cpuSnapshot>, probe: CpuProbe): Record<string, number> {
  const after = cpuSnapshot(probe);
  const out: Record<string, number> = {};
  for (const [name, pids] of after) {
    let total = 0;
    for (const [pid, s] of pids) total += s - (before.get(name)?.get(pid) ?? 0);
    out[name] = total;
  }
  return out;
}

/** CPU seconds (user + system) of this process's children that have exited and been waited for. */
export function reapedChildrenCpuSeconds(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[13]) + Number(fields[14])) / CLK_TCK; // cutime, cstime (fields 16 and 17)
}

/** The hard open-file limit of this process (soft can be raised to it without privileges). */
export function hardOpenFileLimit(): number {
  const m = /^Max open files\s+\S+\s+(\S+)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
  return !m || m[1] === 'unlimited' ? 1_048_576 : Number(m[1]);
}


/** User and system CPU seconds of one process (all its threads). */
export interface Cpu {
  user: number;
  system: number;
}

/** User and system CPU seconds used so far by a process (all its threads, not its children). */
export async function cpuOf(pid: number): Promise<Cpu> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { user: Number(fields[11]) / CLK_TCK, system: Number(fields[12]) / CLK_TCK };
}

/** The CPU a process used since `before` was read (undefined when there is no process to read). */
export function cpuSince(pid: number | undefined, before: Cpu | undefined): Promise<Cpu | undefined> {
  if (pid === undefined || before === undefined) return Promise.resolve(undefined);
  return cpuOf(pid).then((now) => ({ user: now.user - before.user, system: now.system - before.system }));
}
