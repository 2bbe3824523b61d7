/**
 * bench:mux — the cost of the Proxy's single-port router (src/mux/multiplexer.ts), against two baselines
 * measured in the same run. Every path carries the same TLS stream, ended by the same backend:
 *
 *   direct       client TLS (ALPN gateway-tcp) -> backend
 *   multiplexer  client TLS -> a net.Server running `Multiplexer` whose gateway-tcp route passes the bytes
 *                through (net.connect + src/mux/pump.ts, no termination) -> backend. What is measured is the router
 *                alone: sniff + ClientHello parse + route + byte pump. The router process loads the multiplexer from
 *                dist/ (what `gateway start` runs, built by `npm run bench:mux`), not through tsx: tsx wraps every
 *                closure in a __name() call that gives it a property of its own, which cost the router about a
 *                quarter of its heap per connection and some of its CPU.
 *   HAProxy      client TLS -> haproxy (Debian package, TCP mode, `req_ssl_hello_type` + `req_ssl_sni` +
 *                `req.ssl_alpn` routing, passthrough) -> backend. The peer.
 *
 * Both routers do the same decisions per connection: SNI prefix kube-gateway-proxy-alpn. (never taken), SNI
 * idle.gw.test (the idle backend of the memory test), ALPN gateway-tcp. The backend is a Node TLS server on
 * 127.0.0.3 (test CA, ECDSA P-256, ALPN gateway-tcp): SNI sink.gw.test counts bytes, any other name echoes.
 *
 * Processes: the client and the backend share this process; each router runs in its own process (the multiplexer in
 * a child Node process, bench/mux/router.ts, haproxy with nbthread 1: one event loop each), so its
 * CPU time can be read from /proc/<pid>/stat on its own. All of them are pinned to one CPU by default (BENCH_CPU,
 * BENCH_ROUTER_CPU, "any" to leave a side unpinned): every figure then includes the router's CPU cost, and round
 * trips do not depend on whether the scheduler put the router on the other vCPU (waking an idle vCPU costs tens of
 * µs on a VM and made unpinned round trips bimodal).
 *
 * Figures per path (the paths take turns run by run, sample by sample or batch by batch, so that load from elsewhere
 * on the machine hits all three alike):
 *   throughput       one TLS stream, BENCH_MIB MiB pushed to the sink until the sink has them all (plaintext
 *                    MiB/s), median of BENCH_RUNS runs
 *   round trip       64 bytes written and echoed back over one established connection, BENCH_RTTS samples
 *   connect          TCP + TLS handshake until one byte has been echoed back, sequential, BENCH_CONNECTS samples
 *   connections/s    BENCH_CONNS connections of connect + handshake + 1-byte echo + close, BENCH_CONCURRENCY in
 *                    flight. Connect and connections/s come after BENCH_WARM connections through each path, so that
 *                    they measure a Proxy that has run for a while: before that, V8 is still compiling the
 *                    connection path on background threads, which share the router's CPU
 *   router CPU       user+system CPU of the router process during the throughput and connections/s phases
 *   idle memory      RSS growth of a fresh router process per idle connection, BENCH_IDLE connections that sent
 *                    half a ClientHello (waiting in detection), then, in another fresh process, connections
 *                    routed to an idle backend. The multiplexer's RSS is read after global.gc(). Kernel socket
 *                    buffers are not in any RSS.
 *
 * Settings (environment): BENCH_MIB (512), BENCH_RUNS (3), BENCH_RTTS (5000), BENCH_CONNECTS (500), BENCH_CONNS (2000),
 * BENCH_CONCURRENCY (8), BENCH_IDLE (5000), BENCH_WARM (2000), BENCH_CPU (0), BENCH_ROUTER_CPU (= BENCH_CPU), BENCH_HAPROXY_THREADS (1),
 * BENCH_HAPROXY (/usr/sbin/haproxy), BENCH_ROUTER_NODE_ARGS (extra node flags for the multiplexer's process, e.g.
 * "--cpu-prof --cpu-prof-dir=/tmp/prof" to see where its time goes).
 *
 * This file is the order of the phases; each concern has its file under bench/mux/: settings.ts (the environment
 * above), paths.ts (the backend and the TLS client), router.ts (the multiplexer's process) and routers.ts (starting
 * it and HAProxy), speed.ts, memory.ts, report.ts (the section); bench/lib/proc.ts reads CPU and memory from /proc.
 *
 * Writes the figures, ratios and the machine to bench/RESULTS.md (section "mux"; BENCH_RECORD=0: print only).
 */
import { spawnSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { startSilentServer } from '../test/helpers/servers.js';
import { makeTestPki } from '../test/helpers/tls.js';
import { measureMemory } from './mux/memory.js';
import { makeClient, now, startBackend, type Path } from './mux/paths.js';
import { muxSection } from './mux/report.js';
import { startHaproxy, startRouter } from './mux/routers.js';
import { BACKEND_IP, CPU, DETECT_MS, HAPROXY, NAMES, ROUTER_IP } from './mux/settings.js';
import { measureSpeed } from './mux/speed.js';
import { recordSection } from './record.js';

/** The whole bench: pin, start the backend and the routers, the speed figures, the memory figures, the section. */
async function main(): Promise<void> {
  const started = now();
  const loadBefore = loadavg()[0]!;
  if (CPU !== 'any') {
    const pinned = spawnSync('taskset', ['-a', '-p', '-c', CPU, String(process.pid)], { encoding: 'utf8' });
    if (pinned.status !== 0) throw new Error(`taskset -a -p -c ${CPU} failed: ${pinned.stderr.trim()}`);
  }
  const dir = await mkdtemp(join(tmpdir(), 'gw-bench-mux-'));
  const pki = await makeTestPki(dir);
  const cert = await pki.serverCert({ names: Object.values(NAMES), ips: [BACKEND_IP] });
  const cleanups: Array<() => Promise<void> | void> = [() => rm(dir, { recursive: true, force: true })];
  // --- backend: TLS echo (any name) and sink (sink.gw.test); an idle backend for the routed memory case ----------
  const backend = await startBackend(cert);
  cleanups.push(() => backend.close());
  const idle = await startSilentServer(BACKEND_IP);
  cleanups.push(() => idle.close());
  try {
    const haproxyVersion = spawnSync(HAPROXY, ['-v'], { encoding: 'utf8' }).stdout.split('\n')[0]?.replace(/ - https?:\S+/, '').trim();
    if (!haproxyVersion) throw new Error(`${HAPROXY} -v gave nothing: is haproxy installed?`);
    // --- the three paths ------------------------------------------------------------------------------------
    const router = await startRouter(backend.port, idle.port, DETECT_MS);
    cleanups.push(() => router.stop());
    const haproxy = await startHaproxy(dir, 'speed', backend.port, idle.port, DETECT_MS);
    cleanups.push(() => haproxy.stop());
    const paths: Path[] = [
      { name: 'direct', host: BACKEND_IP, port: backend.port },
      { name: 'multiplexer', host: ROUTER_IP, port: router.port, pid: router.pid },
      { name: 'HAProxy', host: ROUTER_IP, port: haproxy.port, pid: haproxy.pid },
    ];
    const client = makeClient(pki.caPem);
    const speed = await measureSpeed(client, backend, paths);
    await router.stop();
    await haproxy.stop();
    // --- memory per idle connection, each case in a fresh router process ----------------------------------------
    const mem = await measureMemory(pki.caPem, dir, backend.port, idle);
    const section = muxSection({ started, loadBefore, haproxyVersion, negotiated: client.negotiated(), speed, mem });
    process.stdout.write(`${section}\n`);
    if (process.env.BENCH_RECORD !== '0') await recordSection('mux', section);
  } finally {
    for (const c of cleanups.reverse()) await c();
  }
}

await main();
