/**
 * bench:tunnel's idle-memory phase: a fresh Proxy daemon (a bench-only preload answers SIGPWR with a full gc and
 * its memory figures), BENCH_AGENTS identities joined and then connected in steps by BENCH_AGENT_PROCS child
 * processes (bench/tunnel/idle-agents.ts), the Proxy's VmRSS at each step and its CPU while every agent idles; and
 * the rows and paragraph of the section it measured.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import getPort from 'get-port';
import { runCli, startGateway, type RunningGateway } from '../../test/helpers/gateway.js';
import { sleep, stopChild } from '../common.js';
import { PROFILER_PRELOAD, PROFILER_SIGNAL } from '../lib/cpuprofile.js';
import { cpuSeconds, hardOpenFileLimit, processTree, rssKiB } from '../lib/proc.js';
import type { TlsFloor } from '../tlsfloor.js';
import { proxyConfig, stopGateway } from './gateway.js';
import type { FromChild, ToChild } from './idle-agents.js';
import { AGENT_PROCS, AGENTS, AGENTS_PER_SOURCE, DAEMON_GLIBC_TUNABLES, HEAP_DIR, IDLE_CPU_SECS, PROXY_IP, PROXY_NAME } from './settings.js';

export interface AgentHolder {
  child: ChildProcess;
  ask(m: ToChild): Promise<Extract<FromChild, { op: 'done' }>>;
  stop(): Promise<void>;
}

/** A child process holding idle agents, with its open-file limit raised to the hard limit. */
function startAgentHolder(): AgentHolder {
  const argv = [process.execPath, ...process.execArgv, fileURLToPath(new URL('./idle-agents.ts', import.meta.url))];
  const child = spawn('sh', ['-c', `ulimit -n ${hardOpenFileLimit()} && exec "$@"`, 'sh', ...argv], {
    env: process.env,
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  let pending: { resolve: (m: Extract<FromChild, { op: 'done' }>) => void; reject: (e: Error) => void } | undefined;
  child.on('message', (m: FromChild) => {
    const p = pending;
    pending = undefined;
    if (m.op === 'done') p?.resolve(m);
    else p?.reject(new Error(`idle agents: ${m.message}`));
  });
  child.once('exit', (code) => pending?.reject(new Error(`the idle agents' process exited with ${code}`)));
  return {
    child,
    ask: (m) =>
      new Promise((resolve, reject) => {
        pending = { resolve, reject };
        child.send(m);
      }),
    stop: async () => {
      if (child.connected) child.disconnect();
      await stopChild(child);
    },
  };
}

/** What main's cleanup stops if a phase fails half-way. */
export interface Tracked {
  memProxy?: RunningGateway;
  holders: AgentHolder[];
}

export interface IdleMemory {
  agents: number;
  procs: number;
  joinSecs: number;
  connectSecs: number;
  /** VmRSS (KiB) of the Proxy before the first agent, then at each checkpoint (agents connected). */
  rssBefore: number;
  readings: Array<{ agents: number; rssKiB: number; gc: GcReading }>;
  /** The same before the first agent, after a full gc. */
  gcBefore: GcReading;
  allUp: boolean;
  openFiles: number;
  /** The Proxy's CPU seconds over `secs` once every agent was connected and idle (heartbeats, presence refreshes). */
  idleCpu?: { secs: number; cpuSecs: number };
  /** VmRSS (KiB) after that idle time, as it is (no gc forced): what an operator sees once the Proxy has settled. */
  idleRssKiB?: number;
  /** After that idle time, a full gc again: whether V8 gave back what the connection storm left (its memory reducer). */
  idleGc?: GcReading;
  /** bench/tlsfloor.ts: a bare Node.js TLS server's VmRSS per idle connection, measured after this phase. */
  floor?: TlsFloor;
}



/**
 * A preload for the idle-memory Proxy (bench only): on SIGPWR, a full garbage collection, then the process's memory
 * figures written to BENCH_GC_OUT. The TLS floor is read after gc, so the Proxy is too; and the JS heap against
 * VmRSS tells the gateway's own objects from what its TLS connections hold natively.
 */
const GC_PRELOAD = `
const v8 = require('node:v8');
const vm = require('node:vm');
const { readFileSync, writeFileSync } = require('node:fs');
v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc');
process.on('SIGPWR', () => {
  gc();
  const m = process.memoryUsage();
  const status = readFileSync('/proc/self/status', 'utf8');
  const kib = (name) => Number((new RegExp(name + ':\\\\s+(\\\\d+)').exec(status) || [0, 0])[1]);
  if (process.env.BENCH_HEAP_DIR) v8.writeHeapSnapshot(require('node:path').join(process.env.BENCH_HEAP_DIR, 'heap-' + Date.now() + '.heapsnapshot'));
  writeFileSync(process.env.BENCH_GC_OUT, JSON.stringify({ rssKiB: kib('VmRSS'), heapKiB: m.heapUsed / 1024, heapTotalKiB: m.heapTotal / 1024, externalKiB: m.external / 1024, anonKiB: kib('RssAnon'), fileKiB: kib('RssFile'), shmemKiB: kib('RssShmem') }));
});
`;

/** The Proxy's memory after a full gc (through GC_PRELOAD), KiB: VmRSS and its anonymous, file-backed and shared parts. */
export interface GcReading {
  rssKiB: number;
  heapKiB: number;
  /** What V8 holds for its heap (used and free pages it keeps). */
  heapTotalKiB: number;
  externalKiB: number;
  anonKiB: number;
  fileKiB: number;
  shmemKiB: number;
}

/** The Proxy's memory after a full gc (through GC_PRELOAD). */
async function afterGc(pid: number, out: string): Promise<GcReading> {
  await rm(out, { force: true });
  process.kill(pid, 'SIGPWR');
  for (let i = 0; i < (HEAP_DIR ? 3000 : 300); i++) {
    await sleep(100);
    const text = await readFile(out, 'utf8').catch(() => '');
    if (text) return JSON.parse(text) as GcReading;
  }
  throw new Error('the Proxy did not answer the gc signal');
}

/** The idle-memory phase: a fresh Proxy daemon, AGENTS identities joined, then connected in steps. */
export async function measureIdleMemory(dir: string, adminEnv: Record<string, string>, say: (s: string) => void, track: Tracked): Promise<IdleMemory> {
  const openFiles = hardOpenFileLimit();
  if (openFiles < AGENTS + 2000) throw new Error(`BENCH_AGENTS=${AGENTS} needs an open-file limit above ${AGENTS + 2000} (the Proxy holds one connection per agent); the hard limit here is ${openFiles}`);
  const memPort = await getPort({ host: PROXY_IP });
  const memAddr = `${PROXY_NAME}:${memPort}`;
  const memDataDir = join(dir, 'mem-data');
  // One listener holds every agent: its cap is written (an operator with this many agents does the same).
  const profDir = process.env.BENCH_IDLE_PROFILE;
  if (profDir) await writeFile(join(dir, 'profiler.cjs'), PROFILER_PRELOAD);
  await writeFile(join(dir, 'gc.cjs'), GC_PRELOAD);
  const gcOut = join(dir, 'gc.json');
  const preloads = [`--require ${join(dir, 'gc.cjs')}`, ...(profDir ? [`--require ${join(dir, 'profiler.cjs')}`] : [])].join(' ');
  const memProxy = await startGateway(proxyConfig('idle.example', memPort, AGENTS + 1000), {
    dataDir: memDataDir,
    openFiles,
    env: { NODE_OPTIONS: preloads, BENCH_GC_OUT: gcOut, ...(HEAP_DIR ? { BENCH_HEAP_DIR: HEAP_DIR } : {}), ...(profDir ? { BENCH_CPU_PROF_DIR: profDir } : {}), ...(DAEMON_GLIBC_TUNABLES ? { GLIBC_TUNABLES: DAEMON_GLIBC_TUNABLES } : {}) },
  });
  track.memProxy = memProxy;
  const memPid = memProxy.process.pid!;
  const r = await runCli('gwctl', ['--data-dir', memDataDir, 'tokens', 'add', '--type=app', '--uses=0', '--ttl=1h', '--format', 'json'], { env: adminEnv });
  if (r.status !== 0) throw new Error(`gwctl tokens add: ${r.stderr}`);
  const memToken = JSON.parse(r.stdout) as { token: string; ca_pin: string };
  for (let c = 0; c < AGENT_PROCS; c++) track.holders.push(startAgentHolder());
  const share = (c: number, n: number) => Math.floor(n / AGENT_PROCS) + (c < n % AGENT_PROCS ? 1 : 0);
  const tJoin = Date.now();
  await Promise.all(
    track.holders.map((h, c) =>
      h.ask({
        op: 'join',
        addr: memAddr,
        token: memToken.token,
        pin: memToken.ca_pin,
        names: Array.from({ length: share(c, AGENTS) }, (_, i) => `idle-${c}-${i}`),
        sourceBase: `127.${10 + c}.0`,
        concurrency: 8,
      }),
    ),
  );
  const joinSecs = (Date.now() - tJoin) / 1000;
  say(`memory: ${AGENTS} identities joined in ${joinSecs.toFixed(1)} s by ${AGENT_PROCS} processes; CPU s: Proxy ${cpuSeconds(memPid).toFixed(1)}, agents ${track.holders.map((h) => processTree(h.child.pid!).map((p) => cpuSeconds(p)).reduce((a, b) => a + b, 0).toFixed(1)).join(', ')}`);
  await sleep(2000);
  const rssBefore = await rssKiB(memPid);
  const gcBefore = await afterGc(memPid, gcOut);
  const checkpoints = [...new Set([Math.floor(AGENTS / 4), Math.floor(AGENTS / 2), AGENTS])].filter((n) => n > 0);
  const readings: IdleMemory['readings'] = [];
  let connectSecs = 0;
  let have = 0;
  let allUp = true;
  for (const target of checkpoints) {
    if (profDir && target === AGENTS) memProxy.process.kill(PROFILER_SIGNAL);
    const t0 = Date.now();
    const answers = await Promise.all(track.holders.map((h, c) => h.ask({ op: 'connect', count: share(c, target) - share(c, have), concurrency: 32 })));
    connectSecs += (Date.now() - t0) / 1000;
    have = target;
    await sleep(3000);
    const rss = await rssKiB(memPid);
    readings.push({ agents: target, rssKiB: rss, gc: await afterGc(memPid, gcOut) });
    const up = answers.reduce((a, m) => a + m.connected, 0);
    allUp = up === target;
    say(`memory: ${target} agents connected (${up} up) after ${connectSecs.toFixed(1)} s: Proxy VmRSS ${(rss / 1024).toFixed(1)} MiB; CPU s: Proxy ${cpuSeconds(memPid).toFixed(1)}, agents ${track.holders.map((h) => processTree(h.child.pid!).map((p) => cpuSeconds(p)).reduce((a, b) => a + b, 0).toFixed(1)).join(', ')}`);
  }
  let idleCpu: IdleMemory['idleCpu'];
  let idleGc: GcReading | undefined;
  let idleRss: number | undefined;
  if (IDLE_CPU_SECS > 0) {
    const cpu0 = cpuSeconds(memPid);
    await sleep(IDLE_CPU_SECS * 1000);
    idleCpu = { secs: IDLE_CPU_SECS, cpuSecs: cpuSeconds(memPid) - cpu0 };
    say(`memory: Proxy CPU while ${AGENTS} agents idle: ${(idleCpu.cpuSecs * 1000 / IDLE_CPU_SECS).toFixed(1)} ms/s`);
    idleRss = await rssKiB(memPid);
    idleGc = await afterGc(memPid, gcOut);
  }
  // Still all up after the last reading?
  const last = await Promise.all(track.holders.map((h) => h.ask({ op: 'check' })));
  allUp &&= last.reduce((a, m) => a + m.connected, 0) === AGENTS;
  for (const h of track.holders.splice(0)) await h.stop();
  await stopGateway(memProxy);
  track.memProxy = undefined;
  return { agents: AGENTS, procs: AGENT_PROCS, joinSecs, connectSecs, rssBefore, gcBefore, readings, allUp, openFiles, ...(idleCpu ? { idleCpu } : {}), ...(idleRss ? { idleRssKiB: idleRss } : {}), ...(idleGc ? { idleGc } : {}) };
}


/** Per idle agent at a checkpoint: overall (from the reading before any agent) and over its second half. */
function perAgent(mem: IdleMemory, n: number): { overall: number; secondHalf: number } | undefined {
  const at = mem.readings.find((r) => r.agents === n);
  const half = mem.readings.find((r) => r.agents === Math.floor(n / 2));
  if (!at) return undefined;
  return { overall: (at.rssKiB - mem.rssBefore) / n, secondHalf: half ? (at.rssKiB - half.rssKiB) / (n - half.agents) : NaN };
}

/**
 * The table rows: per agent at all of BENCH_AGENTS once idle (first: the README's headline takes the first "Proxy
 * memory per idle" row, the VmRSS an operator sees once the Proxy has settled, no gc forced), then right after the
 * last agent connected and at half of them, overall and over the second half.
 */
export function idleMemoryRows(mem: IdleMemory): string[] {
  const per = (kib: number, before: number) => ((kib - before) / mem.agents).toFixed(1);
  const cpu = mem.idleCpu
    ? [`| Proxy CPU while ${mem.agents} agents are connected and idle, over ${mem.idleCpu.secs} s (ms of CPU per s) | – | ${((mem.idleCpu.cpuSecs * 1000) / mem.idleCpu.secs).toFixed(1)} | – | – | – |`]
    : [];
  if (mem.idleGc && mem.idleCpu) {
    cpu.push(
      `| Proxy memory per idle connected agent at ${mem.agents} agents, ${mem.idleCpu.secs} s later, after a full gc (KiB of VmRSS) | – | ${per(mem.idleGc.rssKiB, mem.gcBefore.rssKiB)} | – | – | – |`,
      `| V8's whole heap then (KiB per agent) | – | ${per(mem.idleGc.heapTotalKiB, mem.gcBefore.heapTotalKiB)} | – | – | – |`,
    );
  }
  const settled = mem.idleRssKiB && mem.idleCpu
    ? [`| Proxy memory per idle connected agent at ${mem.agents} agents, settled: ${mem.idleCpu.secs} s after the last connected (KiB of VmRSS, no gc forced) | – | ${per(mem.idleRssKiB, mem.rssBefore)} | – | – | – |`]
    : [];
  return settled.concat([mem.agents, Math.floor(mem.agents / 2)].flatMap((n) => {
    const f = perAgent(mem, n);
    if (!f || n === 0) return [];
    return [
      `| Proxy memory per idle connected agent at ${n} agents, overall (KiB of VmRSS) | – | ${f.overall.toFixed(1)} | – | – | – |`,
      `| Proxy memory per idle connected agent at ${n} agents, over the second half (KiB of VmRSS) | – | ${f.secondHalf.toFixed(1)} | – | – | – |`,
      ...gcRows(mem, n),
    ];
  })).concat(cpu);
}

/** After a full gc (as the floor is read): VmRSS and the JS heap per agent, overall. */
function gcRows(mem: IdleMemory, n: number): string[] {
  const at = mem.readings.find((r) => r.agents === n);
  if (!at) return [];
  return [
    `| Proxy memory per idle connected agent at ${n} agents, after a full gc (KiB of VmRSS) | – | ${((at.gc.rssKiB - mem.gcBefore.rssKiB) / n).toFixed(1)} | – | – | – |`,
    `| of which the JavaScript heap, after a full gc (KiB per agent) | – | ${((at.gc.heapKiB - mem.gcBefore.heapKiB) / n).toFixed(1)} | – | – | – |`,
    `| V8's whole heap (used and kept free pages), after a full gc (KiB per agent) | – | ${((at.gc.heapTotalKiB - mem.gcBefore.heapTotalKiB) / n).toFixed(1)} | – | – | – |`,
    `| of which Node's external memory (Buffers, ArrayBuffers), after a full gc (KiB per agent) | – | ${((at.gc.externalKiB - mem.gcBefore.externalKiB) / n).toFixed(1)} | – | – | – |`,
    `| of which file-backed or shared pages (SQLite's files, code), after a full gc (KiB per agent) | – | ${((at.gc.fileKiB + at.gc.shmemKiB - mem.gcBefore.fileKiB - mem.gcBefore.shmemKiB) / n).toFixed(1)} | – | – | – |`,
  ];
}

/** The idle-memory paragraph of the section. */
export function idleMemoryText(mem: IdleMemory): string {
  const mib = (kib: number) => `${(kib / 1024).toFixed(1)} MiB`;
  const last = perAgent(mem, mem.agents);
  return (
    `- Idle memory (goal: at most 30 KiB of Proxy memory per idle agent at 10 000): a fresh Proxy daemon (auth + proxy in one process, as above; ` +
    `\`gateway.limits.max_connections\` written to ${mem.agents + 1000}, open-file limit ${mem.openFiles}) went from ${mib(mem.rssBefore)} VmRSS ` +
    mem.readings.map((r) => `to ${mib(r.rssKiB)} at ${r.agents}`).join(', ') +
    ` (after a full gc, through a bench-only preload: ${mib(mem.gcBefore.rssKiB)} with a ${mib(mem.gcBefore.heapKiB)} JS heap, then ` +
    mem.readings.map((r) => `${mib(r.gc.rssKiB)} with ${mib(r.gc.heapKiB)} at ${r.agents}`).join(', ') +
    ')' +
    ` idle agents connected${last ? ` (${last.overall.toFixed(1)} KiB per agent overall, ${last.secondHalf.toFixed(1)} over the second half)` : ''}. ` +
    `The agents are real TunnelAgent instances (each its own host identity, TLS to the Proxy with its certificate, then the tunnel's handshake and control channel, ` +
    `heartbeats while idle), so the figure includes each connection's TLS state; they run in ${mem.procs} child processes of the bench, dial the Proxy directly ` +
    `(not through squid: what is measured is the Proxy) from ${AGENTS_PER_SOURCE} agents per loopback source address. ` +
    `The ${mem.agents} identities were joined first through POST /webapi/join with one --uses=0 token (${mem.joinSecs.toFixed(1)} s, 8 joins in flight per process, ` +
    `each worker from its own source address), before the first reading; the agents connected in ${mem.connectSecs.toFixed(1)} s (32 in flight per process); ` +
    `all still connected at the last reading: ${mem.allUp ? 'yes' : 'no'}. The second-half figure leaves out what start-up and the joins left in the heap. Kernel socket buffers are not in RSS.` +
    (mem.idleCpu && mem.idleGc
      ? ` Then ${mem.idleCpu.secs} s with every agent idle: the Proxy used ${((mem.idleCpu.cpuSecs * 1000) / mem.idleCpu.secs).toFixed(1)} ms of CPU per s, ` +
        (mem.idleRssKiB ? `held ${mib(mem.idleRssKiB)} VmRSS as it was (the settled figure, the table's first row), ` : '') +
        `and after a full gc ` +
        `held ${mib(mem.idleGc.rssKiB)} VmRSS with a ${mib(mem.idleGc.heapTotalKiB)} V8 heap (${mib(mem.idleGc.heapKiB)} used): V8's memory reducer returns the free pages the connection storm left once the process is idle.`
      : '') +
    (mem.floor
      ? ` The floor (bench/tlsfloor.ts, same run, the agent's host certificate on both ends): a bare Node.js TLS server holds ${mem.floor.mtlsKiB.toFixed(1)} KiB per idle connection ` +
        `with a client certificate, ${mem.floor.mtlsNoTicketKiB.toFixed(1)} KiB with one and no session tickets sent, and ${mem.floor.tlsKiB.toFixed(1)} KiB without (${mem.floor.connections} connections, VmRSS after gc).`
      : '')
  );
}
