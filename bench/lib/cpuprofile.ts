/**
 * CPU profiles of the gateway's processes under a bench: a preload that starts and stops V8's sampling profiler on
 * a signal (what --cpu-prof uses, which Node 20 refuses in NODE_OPTIONS), and a summary of a .cpuprofile file (the
 * heaviest self-time frames, and shares by group: socket writes, ssh2, Node's streams, GC). bench:tunnel profiles the
 * Proxy, the agent and gwsh with them.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}

export interface FrameShare {
  frame: string;
  share: number;
}

const NATIVE_WRITES = new Set(['writev', 'writeBuffer', 'writeUtf8String', 'writeLatin1String', 'writeAsciiString']);
const NATIVE_SSH2 = new Set(['GenericCipher', 'GenericDecipher', 'AESGCMCipher', 'AESGCMDecipher', 'ChaChaPolyCipher', 'ChaChaPolyDecipher']);

export const PROFILE_GROUPS = ['socket writes', 'ssh2', 'node streams', 'garbage collector', 'other'] as const;

/**
 * Self time per frame (function, file:line) as a share of the busy (non-idle) samples, and per group, by the
 * frame a sample was in: "socket writes" = the native writev/writeBuffer of a socket (for a TLS socket the record
 * encryption, then the write syscall, which on loopback also runs the receiver's TCP input); "ssh2" = ssh2's
 * JavaScript and its native cipher binding, or anything called from ssh2 except socket writes and GC (padding
 * bytes, buffer allocation); "node streams" = Node's own JavaScript (streams, net, tls). The profiler's own
 * stop-and-serialize at exit is left out.
 */
export function summarizeProfile(path: string): {
  top: FrameShare[];
  groups: Record<(typeof PROFILE_GROUPS)[number], number>;
  /** Of the socket writes: the share made by a spliced stream's pipe (agent -> resource, Proxy -> client) rather than for the tunnel. */
  splicedWrites: number;
  busyMs: number;
} {
  const prof = JSON.parse(readFileSync(path, 'utf8')) as { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[] };
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const stack = (id: number) => {
    const out: ProfileNode[] = [];
    for (let c: number | undefined = id; c !== undefined; c = parent.get(c)) out.push(byId.get(c)!);
    return out;
  };
  const self = new Map<number, number>();
  prof.samples.forEach((id, i) => self.set(id, (self.get(id) ?? 0) + (prof.timeDeltas[i] ?? 0)));
  const frames = new Map<string, number>();
  const groups = Object.fromEntries(PROFILE_GROUPS.map((g) => [g, 0])) as Record<(typeof PROFILE_GROUPS)[number], number>;
  let busy = 0;
  let spliced = 0;
  for (const [id, us] of self) {
    const f = byId.get(id)!.callFrame;
    if (f.functionName === '(idle)') continue;
    const frames_ = stack(id);
    if (frames_.some((n) => n.callFrame.url.endsWith('profiler.cjs'))) continue;
    busy += us;
    const file = f.url ? `${f.url.includes('node_modules/') ? f.url.slice(f.url.lastIndexOf('node_modules/') + 13) : basename(f.url)}:${f.lineNumber + 1}` : '';
    const key = `${f.functionName || '(anonymous)'}${file ? ` (${file})` : ''}`;
    frames.set(key, (frames.get(key) ?? 0) + us);
    if (!f.url && NATIVE_WRITES.has(f.functionName)) {
      groups['socket writes'] += us;
      // Walking up from the write: pipe()'s ondata before any ssh2 frame is the plain side of a splice; ssh2 first is the tunnel.
      const first = frames_.find((n) => n.callFrame.functionName === 'ondata' || n.callFrame.url.includes('/ssh2/'));
      if (first?.callFrame.functionName === 'ondata') spliced += us;
    }
    else if (f.functionName === '(garbage collector)') groups['garbage collector'] += us;
    else if (f.url.includes('/ssh2/') || (!f.url && NATIVE_SSH2.has(f.functionName)) || frames_.some((n) => n.callFrame.url.includes('/ssh2/'))) groups.ssh2 += us;
    else if (f.url.startsWith('node:')) groups['node streams'] += us;
    else groups.other += us;
  }
  const top = [...frames.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 6)
    .map(([frame, us]) => ({ frame, share: us / busy }));
  const splicedWrites = groups['socket writes'] > 0 ? spliced / groups['socket writes'] : 0;
  for (const g of PROFILE_GROUPS) groups[g] = groups[g] / busy;
  return { top, groups, splicedWrites, busyMs: busy / 1000 };
}

/**
 * A preload (NODE_OPTIONS=--require; Node 20 refuses --cpu-prof there, and the daemons are started by the test
 * helper) that starts the inspector's CPU profiler (the sampler --cpu-prof uses) on PROFILER_SIGNAL, so start-up is
 * left out, and writes $BENCH_CPU_PROF_DIR/<pid>.cpuprofile on the next one or when the process exits, whichever
 * comes first (gwsh proxy app may be kept alive by a connection the Proxy lets linger).
 */
/**
 * Not SIGUSR2: an agent daemon takes that as a hand-over to a successor (src/cli/start.ts), so profiling an agent with
 * it profiled a process that was handing over, and left two agents running. SIGURG's default is to ignore it, and
 * neither the daemons nor gwsh handle it (SIGWINCH would resize gwsh ssh's terminal).
 */
export const PROFILER_SIGNAL = 'SIGURG';

export const PROFILER_PRELOAD = `
const { Session } = require('node:inspector');
const { mkdirSync, writeFileSync } = require('node:fs');
const dir = process.env.BENCH_CPU_PROF_DIR;
const session = new Session();
session.connect();
session.post('Profiler.enable');
let state = 'idle';
const write = () => {
  if (state !== 'started') return;
  state = 'written';
  // A session in the same thread answers synchronously, so this runs before the process is gone.
  session.post('Profiler.stop', (err, res) => {
    if (err || !res) return;
    mkdirSync(dir, { recursive: true });
    writeFileSync(dir + '/' + process.pid + '.cpuprofile', JSON.stringify(res.profile));
  });
};
process.on('SIGURG', () => {
  if (state !== 'idle') return write();
  state = 'started';
  session.post('Profiler.start');
});
process.once('exit', write);
`;



/** The last .cpuprofile file written to dir, if any. */
export function newestProfile(dir: string): string | undefined {
  if (!existsSync(dir)) return undefined;
  const files = readdirSync(dir).filter((f) => f.endsWith('.cpuprofile'));
  return files.length ? join(dir, files.sort().at(-1)!) : undefined;
}

/** What summarizeProfile reads from one profile. */
export type ProfileSummary = ReturnType<typeof summarizeProfile>;
