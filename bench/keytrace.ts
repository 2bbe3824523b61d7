/**
 * Where a keystroke's round trip goes, hop by hop (bench:ssh with BENCH_TRACE=N): `perf trace` records the
 * read/write system calls of every process on a session's path (the bench's own node-pty, ssh and its
 * descendants, the daemons and theirs) while N keystrokes are typed, then each keystroke is followed from the
 * bench's write through each process in turn: the first read that returned data after the previous hop wrote
 * ("in", at the read's return), then that process's first write after it ("out", at the write's entry). A
 * process's own time is out - in (for Node: JavaScript, TLS/SSH crypto, the event loop's turn); the time between
 * one hop's out and the next hop's in is the kernel handing the bytes over and waking the reader (scheduling).
 * Tracing slows every system call, so the absolute figures are larger than untraced ones: compare hops, and
 * paths traced the same way.
 */
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';

/** A process on the path: its role (a name for the report) and every thread id. */
export interface Traced {
  role: string;
  pid: number;
}

/** The pid and every descendant of pid (through /proc's children lists of every thread). */
export function descendants(pid: number): number[] {
  const out = [pid];
  for (let i = 0; i < out.length; i++) {
    let tasks: string[] = [];
    try {
      tasks = readdirSync(`/proc/${out[i]}/task`);
    } catch {
      continue;
    }
    for (const t of tasks) {
      try {
        for (const c of readFileSync(`/proc/${out[i]}/task/${t}/children`, 'utf8').trim().split(/\s+/)) if (c) out.push(Number(c));
      } catch {
        // the thread ended meanwhile
      }
    }
  }
  return out;
}

/** The command name of pid (/proc/pid/comm), '' once it has gone. */
export function commOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  } catch {
    return '';
  }
}

function threadsOf(pid: number): number[] {
  try {
    return readdirSync(`/proc/${pid}/task`).map(Number);
  } catch {
    return [pid];
  }
}

interface Call {
  /** ms since the trace's start: the call's entry. */
  at: number;
  /** ms: when it returned. */
  end: number;
  role: string;
  write: boolean;
  ret: number;
}

const CALLS = 'read,write,readv,writev,recvfrom,sendto,recvmsg,sendmsg';
/** perf trace's lines: a call that returned at once, or its entry and later its "[continued]" return (it blocked, or other threads' calls came between). */
const DONE = /^\s*([\d.]+) \(\s*([\d.]+) ms\): .+?\/(\d+) (\w+)\((.*)\)\s+= (-?\d+)/;
const ENTRY = /^\s*([\d.]+) \(\s*\): .+?\/(\d+) (\w+)\((.*)\)\s+\.\.\.\s*$/;
const CONTINUED = /^\s*([\d.]+) \(\s*([\d.]+) ms\): .+?\/(\d+)\s+\.\.\. \[continued\]: (\w+)\(\)\)\s+= (-?\d+)/;

/** The file descriptors of pid that carry no data of the path: eventfds, timerfds, epoll (libuv's wake-ups). */
function wakeupFds(pid: number): Set<number> {
  const fds = new Set<number>();
  try {
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      try {
        if (readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith('anon_inode:')) fds.add(Number(fd));
      } catch {
        // closed meanwhile
      }
    }
  } catch {
    // the process has gone
  }
  return fds;
}

/** The calls of perf trace's output that moved data on the traced processes' data descriptors. */
function parseTrace(text: string, procs: Traced[]): Call[] {
  const threads = new Map<number, { role: string; skip: Set<number> }>();
  for (const p of procs) {
    const skip = wakeupFds(p.pid);
    for (const t of threadsOf(p.pid)) threads.set(t, { role: p.role, skip });
  }
  const calls: Call[] = [];
  const pending = new Map<number, { at: number; name: string; args: string }>();
  const add = (tid: number, at: number, end: number, name: string, args: string, ret: number) => {
    const thread = threads.get(tid);
    const fd = Number(/\bfd: (\d+)/.exec(args)?.[1] ?? 0); // perf leaves out arguments that are 0
    if (!thread || thread.skip.has(fd)) return;
    calls.push({ at, end, role: thread.role, write: /^(write|writev|sendto|sendmsg)$/.test(name), ret });
  };
  for (const line of text.split('\n')) {
    let m = DONE.exec(line);
    if (m) {
      add(Number(m[3]), Number(m[1]), Number(m[1]) + Number(m[2]), m[4]!, m[5]!, Number(m[6]));
      continue;
    }
    m = ENTRY.exec(line);
    if (m) {
      pending.set(Number(m[2]), { at: Number(m[1]), name: m[3]!, args: m[4]! });
      continue;
    }
    m = CONTINUED.exec(line);
    const entry = m && pending.get(Number(m[3]));
    if (m && entry) {
      pending.delete(Number(m[3]));
      add(Number(m[3]), entry.at, Number(m[1]) + Number(m[2]), entry.name, entry.args, Number(m[5]));
    }
  }
  return calls.sort((a, b) => a.at - b.at);
}

/** Starts perf trace on the processes; resolves with a stop function that resolves with the calls it saw. */
export async function startTrace(procs: Traced[], file: string): Promise<() => Promise<Call[]>> {
  const perf = spawn('perf', ['trace', '-o', file, '-e', CALLS, '-p', procs.map((p) => p.pid).join(',')], { stdio: ['ignore', 'ignore', 'pipe'] });
  let errors = '';
  perf.stderr!.on('data', (c: Buffer) => (errors = (errors + c.toString()).slice(-2000)));
  const exited = new Promise<number | null>((r) => perf.once('exit', r));
  // perf prints nothing when it is attached: give it time to open its events on every thread.
  await new Promise((r) => setTimeout(r, 1500));
  if (perf.exitCode !== null) throw new Error(`perf trace exited with ${perf.exitCode}: ${errors}`);
  return async () => {
    perf.kill('SIGINT');
    await exited;
    return parseTrace(readFileSync(file, 'utf8'), procs);
  };
}

/**
 * Follows each keystroke along chain (the roles in the order the bytes cross them, there and back; the first
 * role is the bench's, which writes the key and reads the echo): for each, the µs spent in each process and
 * between each pair. Keystrokes where a hop is missing (a call lost, an unrelated write taken) are dropped.
 */
export function hops(calls: Call[], chain: string[]): { labels: string[]; samples: number[][] } {
  const [origin, ...path] = chain;
  const labels: string[] = [];
  for (let i = 0; i < path.length; i++) {
    labels.push(`${i === 0 ? origin : path[i - 1]} -> ${path[i]}`, `in ${path[i]}`);
  }
  labels.push(`${path[path.length - 1]} -> ${origin}`, 'total');
  const samples: number[][] = [];
  const starts = calls.filter((c) => c.role === origin && c.write && c.ret > 0);
  for (const start of starts) {
    const row: number[] = [];
    let cursor = start.at;
    let ok = true;
    let from = 0;
    for (const role of path) {
      const i = calls.findIndex((c, k) => k >= from && c.role === role && !c.write && c.ret > 0 && c.end >= cursor);
      if (i < 0) {
        ok = false;
        break;
      }
      const j = calls.findIndex((c, k) => k > i && c.role === role && c.write && c.ret > 0);
      if (j < 0) {
        ok = false;
        break;
      }
      row.push(calls[i]!.end - cursor, calls[j]!.at - calls[i]!.end);
      cursor = calls[j]!.at;
      from = i;
    }
    const back = ok ? calls.find((c) => c.role === origin && !c.write && c.ret > 0 && c.end >= cursor) : undefined;
    if (!back) continue;
    row.push(back.end - cursor, back.end - start.at);
    // A keystroke whose echo came after the next keystroke's write was mismatched: drop it.
    const next = starts.find((s) => s.at > start.at);
    if (next && back.end > next.at) continue;
    samples.push(row.map((ms) => ms * 1000));
  }
  return { labels, samples };
}
