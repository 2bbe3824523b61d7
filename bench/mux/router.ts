/**
 * bench:mux's router process, a child's entry: a net.Server running only the Multiplexer, whose gateway-tcp route
 * passes the bytes through to the backend (SNI idle.gw.test: to the idle backend). It loads the multiplexer from
 * dist/ (what `gateway start` runs; see the top of bench/mux.ts for why not through tsx), says { type: 'ready', port }
 * over IPC, then answers 'stats' (connections in detection, routed, open) and 'mem' (after global.gc()).
 *
 * Arguments: <backend TLS port> <idle backend port> <detection deadline ms>. Started by bench/mux/routers.ts.
 */
import net from 'node:net';
import { createLogger } from '../../src/log.js';
import type { Multiplexer as MultiplexerClass, RouteHandler } from '../../src/mux/multiplexer.js';
import type { passThrough as PassThrough } from '../../src/mux/pump.js';
import { rssKiB } from '../lib/proc.js';
import { ALPN, BACKEND_IP, NAMES, ROUTER_IP } from './settings.js';

/** A request from the bench, answered with the same id. */
export type RouterRequest = { id: number; cmd: 'stats' | 'mem' };
/** Ready once, then the answers. */
export type RouterReply =
  | { type: 'ready'; port: number }
  | { id: number; detecting: number; routed: number; open: number }
  | { id: number; rss: number; heapUsed: number; external: number };

async function routerMain(args: string[]): Promise<void> {
  const [tlsPort, idlePort, detectMs] = args.map(Number) as [number, number, number];
  // The shipped build (see the top of bench/mux.ts); a path in a variable, so that tsc does not resolve it.
  const dist = new URL('../../dist/mux/', import.meta.url).href;
  const { Multiplexer } = (await import(`${dist}multiplexer.js`)) as { Multiplexer: typeof MultiplexerClass };
  const { passThrough } = (await import(`${dist}pump.js`)) as { passThrough: typeof PassThrough };
  let open = 0; // routed connections not closed yet
  const closed = () => void open--;
  const passthrough: RouteHandler = (stream, info) => {
    const upstream = net.connect({ host: BACKEND_IP, port: info.serverName === NAMES.idle ? idlePort : tlsPort, noDelay: true });
    open++;
    passThrough(stream, upstream, closed);
  };
  const mux = new Multiplexer({
    routes: [
      { name: ALPN, match: { alpn: [{ protocol: ALPN }] }, handler: passthrough },
      { name: 'web', match: { alpn: [{ protocol: 'http/1.1' }, { protocol: 'h2' }], noAlpn: true }, handler: (stream) => stream.destroy() },
    ],
    proxyProtocol: false,
    detectTimeoutMs: detectMs,
    log: createLogger({ level: 'warn' }),
  });
  const server = net.createServer({ noDelay: true }, mux.handleSocket);
  await new Promise<void>((resolve) => server.listen({ host: ROUTER_IP, port: 0, backlog: 4096 }, resolve));
  process.once('SIGTERM', () => process.exit(0)); // a clean exit, so that --cpu-prof and the like can write
  const gc = (globalThis as { gc?: () => void }).gc;
  process.on('message', (msg: RouterRequest) => {
    if (msg.cmd === 'stats') {
      const s = mux.getStats();
      process.send!({ id: msg.id, detecting: s.detecting, routed: s.routed[ALPN] ?? 0, open } satisfies RouterReply);
      return;
    }
    gc?.();
    gc?.();
    const m = process.memoryUsage();
    void rssKiB('self').then((kib) => process.send!({ id: msg.id, rss: kib * 1024, heapUsed: m.heapUsed, external: m.external } satisfies RouterReply));
  });
  process.send!({ type: 'ready', port: (server.address() as net.AddressInfo).port } satisfies RouterReply);
}

// Run as a child only (with an IPC channel), by bench/mux/routers.ts.
if (process.send) await routerMain(process.argv.slice(2));
