/**
 * bench:mux's memory figures: RSS growth of a fresh router process per idle connection, BENCH_IDLE connections that
 * sent half a ClientHello (waiting in detection) or a whole one (routed to an idle backend), each case in its own
 * process after a warm-up of the same kind; and what one ClientHello costs the router in JavaScript (sniff + parse).
 */
import net from 'node:net';
import tls from 'node:tls';
import type { SilentServer } from '../../test/helpers/servers.js';
import { parseClientHello } from '../../src/mux/clienthello.js';
import { sniffProtocol } from '../../src/mux/sniff.js';
import { sleep } from '../common.js';
import { rssKiB } from '../lib/proc.js';
import { now } from './paths.js';
import { startHaproxy, startRouter, waitFor } from './routers.js';
import { ALPN, IDLE, IDLE_DETECT_MS, NAMES, OPEN_CONCURRENCY, ROUTER_IP } from './settings.js';

type Case = 'detecting' | 'routed';

/** Bytes per idle connection, by router and case; the ClientHello and the half of it that was sent. */
export interface MuxMemory {
  mux: Record<Case, number>;
  haproxy: Record<Case, number>;
  hello: Buffer;
  partial: Buffer;
  /** µs of sniff + parse per ClientHello, in this process. */
  parseUs: number;
}

/** One real ClientHello as Node's TLS client sends it to this bench's routers (SNI idle.gw.test, ALPN gateway-tcp). */
async function captureClientHello(ca: string): Promise<Buffer> {
  let client: tls.TLSSocket | undefined;
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, ROUTER_IP, r));
  try {
    return await new Promise<Buffer>((resolve, reject) => {
      server.once('connection', (s) => {
        let buf = Buffer.alloc(0);
        s.on('data', (c: Buffer) => {
          buf = Buffer.concat([buf, c]);
          const parsed = parseClientHello(buf);
          if (parsed.kind === 'hello') {
            s.destroy();
            resolve(buf.subarray(0, parsed.length));
          }
        });
        s.on('error', () => undefined);
      });
      client = tls.connect({ host: ROUTER_IP, port: (server.address() as net.AddressInfo).port, servername: NAMES.idle, ALPNProtocols: [ALPN], ca });
      client.on('error', (err) => (err.message.includes('ECONNRESET') || err.message.includes('socket disconnected') ? undefined : reject(err)));
    });
  } finally {
    client?.destroy();
    server.close();
  }
}

/** n connections to the router that each sent `bytes` and then wait, OPEN_CONCURRENCY being opened at a time. */
async function openIdle(port: number, bytes: Buffer, n: number): Promise<net.Socket[]> {
  const sockets: net.Socket[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: OPEN_CONCURRENCY }, async () => {
      while (next++ < n) {
        const s = await new Promise<net.Socket>((resolve, reject) => {
          const c = net.connect({ host: ROUTER_IP, port }, () => {
            c.off('error', reject);
            resolve(c);
          });
          c.once('error', reject);
        });
        s.on('error', () => undefined);
        s.resume();
        s.write(bytes);
        sockets.push(s);
      }
    }),
  );
  return sockets;
}

const closeAll = (sockets: net.Socket[]) => {
  for (const s of sockets) s.destroy();
};

/** Warm-up connections of the same kind before the baseline (JIT, pools). */
const WARM = Math.min(200, IDLE);

/** The multiplexer's RSS per idle connection, in a fresh process (read after global.gc()). */
async function memMux(c: Case, bytes: Buffer, tlsPort: number, idle: SilentServer): Promise<number> {
  const r = await startRouter(tlsPort, idle.port, IDLE_DETECT_MS);
  try {
    /** n connections held: in detection, or routed with their upstream connection accepted by the idle backend. */
    const holding = async (n: number, idleBase: number) => {
      const s = await r.stats();
      return c === 'detecting' ? s.detecting === n : s.detecting === 0 && s.open === n && idle.connections - idleBase === n;
    };
    // Warm the process up (JIT, pools) with a few connections of the same kind, then take the baseline.
    const warmBase = idle.connections;
    const warm = await openIdle(r.port, bytes, WARM);
    await waitFor('warm-up connections in the multiplexer', () => holding(WARM, warmBase));
    closeAll(warm);
    await waitFor('warm-up connections closed', async () => {
      const s = await r.stats();
      return s.detecting === 0 && s.open === 0;
    });
    await sleep(300);
    const before = await r.mem();
    const idleBase = idle.connections;
    const sockets = await openIdle(r.port, bytes, IDLE);
    await waitFor(`${IDLE} connections ${c} in the multiplexer`, () => holding(IDLE, idleBase));
    await sleep(300);
    const after = await r.mem();
    closeAll(sockets);
    process.stderr.write(
      `memory multiplexer ${c}: RSS ${((after.rss - before.rss) / IDLE).toFixed(0)} B/conn, heap ${((after.heapUsed - before.heapUsed) / IDLE).toFixed(0)} B/conn, external ${((after.external - before.external) / IDLE).toFixed(0)} B/conn\n`,
    );
    return (after.rss - before.rss) / IDLE;
  } finally {
    await r.stop();
  }
}

/** HAProxy's RSS per idle connection, in a fresh process. */
async function memHaproxy(c: Case, bytes: Buffer, dir: string, tlsPort: number, idle: SilentServer): Promise<number> {
  const h = await startHaproxy(dir, `mem-${c}`, tlsPort, idle.port, IDLE_DETECT_MS);
  try {
    const idleAt = idle.connections;
    const warm = await openIdle(h.port, bytes, WARM);
    await waitFor('warm-up connections in haproxy', async () => (await h.currConns()) === WARM && (c === 'detecting' || idle.connections - idleAt === WARM));
    closeAll(warm);
    await waitFor('warm-up connections closed', async () => (await h.currConns()) === 0);
    await sleep(300);
    const before = (await rssKiB(h.pid)) * 1024;
    const idleBase = idle.connections;
    const sockets = await openIdle(h.port, bytes, IDLE);
    await waitFor('connections in haproxy', async () => (await h.currConns()) === IDLE && (c === 'detecting' || idle.connections - idleBase === IDLE));
    await sleep(300);
    const after = (await rssKiB(h.pid)) * 1024;
    closeAll(sockets);
    process.stderr.write(`memory HAProxy ${c}: RSS ${((after - before) / IDLE).toFixed(0)} B/conn\n`);
    return (after - before) / IDLE;
  } finally {
    await h.stop();
  }
}

/** Both routers, both cases, then the cost of one ClientHello's sniff + parse. */
export async function measureMemory(caPem: string, dir: string, tlsPort: number, idle: SilentServer): Promise<MuxMemory> {
  const hello = await captureClientHello(caPem);
  const partial = hello.subarray(0, Math.floor(hello.length / 2));
  if (sniffProtocol(partial).kind !== 'tls' || parseClientHello(partial).kind !== 'need-more') throw new Error('half a ClientHello is not a TLS prefix');
  const mux = { detecting: await memMux('detecting', partial, tlsPort, idle), routed: await memMux('routed', hello, tlsPort, idle) };
  const haproxy = { detecting: await memHaproxy('detecting', partial, dir, tlsPort, idle), routed: await memHaproxy('routed', hello, dir, tlsPort, idle) };
  const PARSES = 200_000;
  for (let i = 0; i < 20_000; i++) parseClientHello(hello);
  const tp = now();
  for (let i = 0; i < PARSES; i++) {
    sniffProtocol(hello);
    parseClientHello(hello);
  }
  const parseUs = ((now() - tp) * 1000) / PARSES;
  return { mux, haproxy, hello, partial, parseUs };
}
