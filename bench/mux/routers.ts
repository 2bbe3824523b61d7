/**
 * bench:mux's routers, each in its own process so that its CPU can be read from /proc on its own: the multiplexer
 * (bench/mux/router.ts, started through taskset with an IPC channel) and the peer, HAProxy (Debian package, TCP
 * mode, routing on req_ssl_sni / req.ssl_alpn, passthrough, a stats socket for its connection count).
 */
import { spawn } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import net from 'node:net';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import getPort from 'get-port';
import { sleep, stopChild } from '../common.js';
import type { RouterReply, RouterRequest } from './router.js';
import { ALPN, BACKEND_IP, HAPROXY, HAPROXY_THREADS, IDLE, NAMES, ROUTER_CPU, ROUTER_IP, ROUTER_NODE_ARGS } from './settings.js';

/** The multiplexer's process: its pid (for its CPU), port, and what it answers over IPC. */
export interface RouterProc {
  pid: number;
  port: number;
  stats(): Promise<{ detecting: number; routed: number; open: number }>;
  mem(): Promise<{ rss: number; heapUsed: number; external: number }>;
  stop(): Promise<void>;
}

/** haproxy's process: its pid, port, and its current connections (from its stats socket). */
export interface HaproxyProc {
  pid: number;
  port: number;
  currConns(): Promise<number>;
  stop(): Promise<void>;
}

/** `taskset -c <list>` arguments for a CPU setting ("any": every CPU, since children inherit our affinity). */
export function cpuList(setting: string): string {
  return setting === 'any' ? `0-${cpus().length - 1}` : setting;
}

/** The multiplexer in its own process (bench/mux/router.ts), pinned to ROUTER_CPU; resolves once it listens. */
export async function startRouter(tlsPort: number, idlePort: number, detectMs: number): Promise<RouterProc> {
  // Through taskset (which execs node, so the pid stays); the IPC channel survives the exec.
  const nodeArgs = [...process.execArgv, '--expose-gc', ...ROUTER_NODE_ARGS];
  const child = spawn('taskset', ['-c', cpuList(ROUTER_CPU), process.execPath, ...nodeArgs, fileURLToPath(new URL('./router.ts', import.meta.url)), String(tlsPort), String(idlePort), String(detectMs)], {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const pending = new Map<number, { resolve: (reply: RouterReply) => void; reject: (err: Error) => void }>();
  let nextId = 1;
  child.once('exit', (code, signal) => {
    for (const p of pending.values()) p.reject(new Error(`the multiplexer process exited (${code ?? signal})`));
    pending.clear();
  });
  const port = await new Promise<number>((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`the multiplexer process exited (${code}) before listening`)));
    child.on('message', (msg: RouterReply) => {
      if ('type' in msg) return resolve(msg.port);
      pending.get(msg.id)?.resolve(msg);
      pending.delete(msg.id);
    });
  });
  const request = (cmd: RouterRequest['cmd']) =>
    new Promise<RouterReply>((resolve, reject) => {
      if (child.exitCode !== null || child.signalCode !== null) return reject(new Error('the multiplexer process has exited'));
      const id = nextId++;
      pending.set(id, { resolve, reject });
      child.send({ id, cmd } satisfies RouterRequest);
    });
  return {
    pid: child.pid!,
    port,
    stats: async () => (await request('stats')) as { detecting: number; routed: number; open: number },
    mem: async () => (await request('mem')) as { rss: number; heapUsed: number; external: number },
    stop: () => stopChild(child, 3000),
  };
}

/** haproxy (TCP mode, the same routing decisions as the multiplexer), pinned to ROUTER_CPU; resolves once it answers. */
export async function startHaproxy(dir: string, tag: string, tlsPort: number, idlePort: number, detectMs: number): Promise<HaproxyProc> {
  const port = await getPort({ host: ROUTER_IP });
  const sock = join(dir, `${tag}.sock`);
  const cfg = join(dir, `${tag}.cfg`);
  // Each connection holds two descriptors; haproxy refuses to start when maxconn needs more than the hard limit.
  const maxconn = IDLE + 1000;
  await writeFile(
    cfg,
    [
      'global',
      `  maxconn ${maxconn}`,
      `  nbthread ${HAPROXY_THREADS}`,
      `  stats socket ${sock} mode 600 level user`,
      'defaults',
      '  mode tcp',
      `  maxconn ${maxconn}`,
      '  timeout connect 5s',
      '  timeout client 300s',
      '  timeout server 300s',
      'frontend fe_mux',
      `  bind ${ROUTER_IP}:${port} backlog 4096`,
      `  tcp-request inspect-delay ${detectMs}ms`,
      '  tcp-request content accept if { req_ssl_hello_type 1 }',
      '  use_backend be_kube if { req_ssl_sni -m beg kube-gateway-proxy-alpn. }',
      `  use_backend be_idle if { req_ssl_sni -i ${NAMES.idle} }`,
      `  use_backend be_tcp if { req.ssl_alpn ${ALPN} }`,
      'backend be_tcp',
      `  server backend ${BACKEND_IP}:${tlsPort}`,
      'backend be_idle',
      `  server idle ${BACKEND_IP}:${idlePort}`,
      'backend be_kube',
      `  server kube ${BACKEND_IP}:${tlsPort}`,
      '',
    ].join('\n'),
  );
  const child = spawn('taskset', ['-c', cpuList(ROUTER_CPU), HAPROXY, '-f', cfg, '-db'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const failed = new Promise<never>((_, reject) => {
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`haproxy exited (${code}) before listening: ${stderr.trim()}`)));
  });
  const command = (cmd: string) =>
    new Promise<string>((resolve, reject) => {
      const s = net.connect(sock);
      let out = '';
      s.on('data', (d: Buffer) => (out += d.toString()));
      s.once('end', () => resolve(out));
      s.once('error', reject);
      s.end(`${cmd}\n`);
    });
  const ready = (async () => {
    for (let i = 0; ; i++) {
      try {
        await command('show info');
        return;
      } catch (err) {
        if (i > 200) throw err;
        await sleep(25);
      }
    }
  })();
  failed.catch(() => undefined);
  try {
    await Promise.race([ready, failed]);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
  return {
    pid: child.pid!,
    port,
    currConns: async () => Number(/^CurrConns: (\d+)$/m.exec(await command('show info'))?.[1] ?? NaN),
    stop: () => stopChild(child, 3000),
  };
}

/** Polls check every 50 ms until it is true; rejects after timeoutMs. */
export async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}
