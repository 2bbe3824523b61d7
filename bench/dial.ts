/**
 * bench:dial — the Dialer through a real squid against two baselines measured in the same run:
 *   direct    plain TCP to the target (the floor)
 *   dialer    Dialer -> squid CONNECT -> target
 *   socat     socat's PROXY address (an HTTP CONNECT client) -> the same squid -> target (the peer)
 *
 * connect latency: from starting the connection until one byte has been echoed back through it (so it includes
 * the CONNECT exchange and one round trip). socat is measured as a local forwarder (TCP-LISTEN,fork ->
 * PROXY:), which is how it is used as an SSH ProxyCommand-style helper; its figure includes its fork per
 * connection. throughput: bytes pushed to a sink that hashes nothing, until the sink has them all.
 *
 * Then connection set-up through a proxy that asks for authentication (Basic, Digest, NTLM, Negotiate), each
 * against curl through the same proxy (bench/dialauth.ts), with the load average around it.
 *
 * Writes the figures, ratios and the machine to bench/RESULTS.md (section "dial").
 */
import { spawn } from 'node:child_process';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import net from 'node:net';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import getPort from 'get-port';
import { Dialer } from '../src/dial/dialer.js';
import { startEchoServer } from '../test/helpers/servers.js';
import { startSquid } from '../test/helpers/squid.js';
import { waitForPort } from '../test/helpers/netns.js';
import { authSetupRows, startTinyHttp, type AuthRow } from './dialauth.js';
import { recordSection } from './record.js';
import { percentile } from './common.js';

const CONNECTS = Number(process.env.BENCH_CONNECTS ?? 300);
const BYTES = Number(process.env.BENCH_MIB ?? 512) << 20;
const RUNS = Number(process.env.BENCH_RUNS ?? 3);
const TARGET_IP = '127.0.0.3';
const TARGET_NAME = 'bench.gw.test';

type Connect = () => Promise<net.Socket>;

async function echoOnce(socket: net.Socket): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    socket.once('data', () => resolve());
    socket.once('error', reject);
    socket.write('x');
  });
  socket.destroy();
}

async function latency(connect: Connect): Promise<{ p50: number; p99: number }> {
  for (let i = 0; i < 20; i++) await echoOnce(await connect()); // warm-up
  const times: number[] = [];
  for (let i = 0; i < CONNECTS; i++) {
    const t0 = process.hrtime.bigint();
    await echoOnce(await connect());
    times.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  times.sort((a, b) => a - b);
  return { p50: percentile(times, 50), p99: percentile(times, 99) };
}

/** A sink that counts bytes per connection and reports when `expected` arrived. */
async function startCountingSink(): Promise<{ port: number; next: (expected: number) => Promise<number>; close: () => void }> {
  let waiter: { expected: number; resolve: (t: number) => void } | undefined;
  const server = net.createServer((s) => {
    let got = 0;
    s.on('data', (c: Buffer) => {
      got += c.length;
      if (waiter && got >= waiter.expected) {
        waiter.resolve(Number(process.hrtime.bigint()));
        waiter = undefined;
      }
    });
    s.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, TARGET_IP, r));
  return {
    port: (server.address() as net.AddressInfo).port,
    next: (expected) => new Promise((resolve) => (waiter = { expected, resolve })),
    close: () => server.close(),
  };
}

async function throughput(connect: Connect, sink: Awaited<ReturnType<typeof startCountingSink>>): Promise<number> {
  const chunk = Buffer.alloc(256 * 1024, 0x5a);
  const rates: number[] = [];
  for (let run = 0; run < RUNS; run++) {
    const socket = await connect();
    const arrived = sink.next(BYTES);
    const t0 = Number(process.hrtime.bigint());
    let sent = 0;
    await new Promise<void>((resolve) => {
      const pump = () => {
        while (sent < BYTES) {
          sent += chunk.length;
          if (!socket.write(chunk)) return void socket.once('drain', pump);
        }
        resolve();
      };
      pump();
    });
    const t1 = await arrived;
    socket.destroy();
    rates.push(BYTES / ((t1 - t0) / 1e9) / (1 << 20));
  }
  rates.sort((a, b) => a - b);
  return rates[Math.floor(rates.length / 2)]!;
}

async function main(): Promise<void> {
  const startLoad = loadavg()[0]!;
  const dir = await mkdtemp(join(tmpdir(), 'gw-bench-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${TARGET_IP} ${TARGET_NAME}\n`, { mode: 0o644 });
  const squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  const echo = await startEchoServer(TARGET_IP);
  const sink = await startCountingSink();
  const socatPorts = { echo: await getPort({ host: '127.0.0.1' }), sink: await getPort({ host: '127.0.0.1' }) };
  const socats = [
    spawn('socat', [`TCP-LISTEN:${socatPorts.echo},bind=127.0.0.1,fork,reuseaddr`, `PROXY:${squid.host}:${TARGET_NAME}:${echo.port},proxyport=${squid.port}`]),
    spawn('socat', [`TCP-LISTEN:${socatPorts.sink},bind=127.0.0.1,fork,reuseaddr`, `PROXY:${squid.host}:${TARGET_NAME}:${sink.port},proxyport=${squid.port}`]),
  ];
  try {
    await waitForPort('127.0.0.1', socatPorts.echo);
    await waitForPort('127.0.0.1', socatPorts.sink);
    // The Dialer never proxies loopback targets, so it dials a name that only squid's hosts file knows.
    const dialer = new Dialer({ env: { HTTPS_PROXY: squid.url } });
    const viaDialer = (port: number): Connect => () => dialer.dial(`${TARGET_NAME}:${port}`);
    const direct = (port: number): Connect => () =>
      new Promise((resolve, reject) => {
        const s = net.connect({ host: TARGET_IP, port, noDelay: true }, () => resolve(s));
        s.once('error', reject);
      });
    const local = (port: number): Connect => () =>
      new Promise((resolve, reject) => {
        const s = net.connect({ host: '127.0.0.1', port, noDelay: true }, () => resolve(s));
        s.once('error', reject);
      });

    const rows = [
      { name: 'direct TCP', lat: await latency(direct(echo.port)), tput: await throughput(direct(sink.port), sink) },
      { name: 'Dialer via squid', lat: await latency(viaDialer(echo.port)), tput: await throughput(viaDialer(sink.port), sink) },
      { name: 'socat via squid (peer)', lat: await latency(local(socatPorts.echo)), tput: await throughput(local(socatPorts.sink), sink) },
    ];
    const [d, g, s] = rows as [typeof rows[0], typeof rows[0], typeof rows[0]];
    const fmt = (n: number) => n.toFixed(3);
    const table = [
      '| path | connect+1 RTT p50 (ms) | p99 (ms) | throughput (MiB/s) |',
      '|---|---|---|---|',
      ...rows.map((r) => `| ${r.name} | ${fmt(r.lat.p50)} | ${fmt(r.lat.p99)} | ${r.tput.toFixed(0)} |`),
    ];
    const ratios = [
      `- Dialer vs socat (peer): p50 latency ${(g.lat.p50 / s.lat.p50).toFixed(2)}x, p99 ${(g.lat.p99 / s.lat.p99).toFixed(2)}x, throughput ${(g.tput / s.tput).toFixed(2)}x (latency below 1 and throughput above 1 is better).`,
      `- Dialer vs direct TCP: p50 latency ${(g.lat.p50 / d.lat.p50).toFixed(2)}x, throughput ${(g.tput / d.tput).toFixed(2)}x.`,
    ];
    const web = await startTinyHttp(TARGET_IP);
    const auth = await authSetupRows(join(dir, 'hosts'), `${TARGET_NAME}:${web.port}`).finally(() => web.close());
    const cpu = cpus();
    const section = [
      '## dial',
      '',
      `Run ${new Date().toISOString()} with \`npm run bench:dial\`: ${CONNECTS} sequential connections per path for latency, ` +
        `median of ${RUNS} runs of ${BYTES >> 20} MiB for throughput. squid 5 (Debian) on 127.0.0.2, target on ${TARGET_IP}.`,
      `Machine: ${cpu[0]?.model ?? 'unknown CPU'}, ${cpu.length} cores, ${(totalmem() / 2 ** 30).toFixed(1)} GiB memory, Node ${process.version}; ` +
        `load average ${startLoad.toFixed(2)} at the start.`,
      '',
      ...table,
      '',
      ...ratios,
      '- socat runs as a local forwarder (TCP-LISTEN,fork -> PROXY:), so its figures include one more loopback hop and a',
      '  fork per connection: it is the usual way to give a program without proxy support a CONNECT tunnel.',
      '',
      ...authTable(auth),
    ].join('\n');
    process.stdout.write(`${section}\n`);
    await recordSection('dial', section);
  } finally {
    for (const p of socats) p.kill();
    sink.close();
    await echo.close();
    await squid.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

/** The authenticated set-up table: per scheme, the Dialer and curl through the same proxy, and their ratio. */
function authTable(a: { rows: AuthRow[]; skipped: string[]; load: [number, number] }): string[] {
  const fmt = (n: number) => n.toFixed(2);
  return [
    '### Connection set-up through an authenticating proxy',
    '',
    'A fresh Dialer per sample dials through the proxy (the whole 407 exchange each time), sends a small HTTP GET and',
    "reads the answer; curl does the same GET through a CONNECT tunnel (`-p`, `--proxy-anyauth` / `--proxy-ntlm` /",
    "`--proxy-negotiate`), timed by itself (`%{time_total}`, its process start not counted); samples alternate. " +
      `${Number(process.env.BENCH_AUTH_SAMPLES ?? 40)} samples per path after 3 unmeasured.`,
    `Load average (1 min) ${a.load[0].toFixed(2)} before, ${a.load[1].toFixed(2)} after: the machine was shared with other work, so the ` +
      'absolute figures are noisy; the ratios compare paths measured side by side.',
    '',
    '| scheme | Dialer p50 (ms) | p90 (ms) | curl p50 (ms) | p90 (ms) | Dialer / curl (p50) |',
    '|---|---|---|---|---|---|',
    ...a.rows.map((r) => `| ${r.scheme} | ${fmt(r.dialer.p50)} | ${fmt(r.dialer.p90)} | ${fmt(r.curl.p50)} | ${fmt(r.curl.p90)} | ${(r.dialer.p50 / r.curl.p50).toFixed(2)}x |`),
    '',
    ...(a.skipped.length > 0 ? [`Not measured here: ${a.skipped.join('; ')}.`, ''] : []),
  ];
}

await main();
