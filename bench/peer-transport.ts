/**
 * bench/peer-transport.ts — which transport carries Proxy peering (src/proxy/peer.ts): node:http2 streams or the
 * ssh2 channel protocol the reverse tunnels use, each over TLS on loopback, measured in the same run.
 *
 *   http2   TLS 1.3 (ALPN h2) -> one http2 session -> one POST stream per connection; the server pipes it to a
 *           sink (throughput) or echoes it (round trip)
 *   ssh2    TLS 1.3 -> ssh2 Client/Server (aes128-gcm@openssh.com, the tunnels' cipher) -> one forwarded-tcpip
 *           channel per connection, same sink / echo
 *   tls     (BENCH_TLS=1) a TLS 1.3 connection per stream, resuming the last session (one client secure
 *           context), its first line naming sink or echo, then raw bytes (src/proxy/peer.ts gateway-peer-tls)
 *
 * Figures: single-stream throughput (BENCH_MIB MiB, median of BENCH_RUNS, transports interleaved) and 64-byte
 * round trip p50/p99 (BENCH_RTTS samples on one established stream), and the time to open a stream and make its
 * first 64-byte round trip (BENCH_OPENS sequential opens, p50). Everything runs in this process: what is
 * compared is the protocol stacks' cost, not a network. Prints a section; BENCH_RECORD=1 writes it to
 * bench/RESULTS.md ("peer-transport").
 */
import http2 from 'node:http2';
import net from 'node:net';
import { loadavg } from 'node:os';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import ssh2 from 'ssh2';
import { generateAuthority, generateKeyPair, issueTlsCert, sshPrivateKeyPem } from '../src/auth/pki.js';
import { envNumber, echoOnce, pushToSink } from './common.js';
import { recordSection } from './record.js';

const MIB = envNumber('BENCH_MIB', 256);
const RUNS = envNumber('BENCH_RUNS', 3);
const RTTS = envNumber('BENCH_RTTS', 3000);
const OPENS = envNumber('BENCH_OPENS', 300);
const CHUNK = Buffer.alloc(64 * 1024, 7);

type Opener = (mode: 'sink' | 'echo') => Promise<Duplex>;

interface Transport {
  name: string;
  open: Opener;
  close(): void;
}

async function tlsMaterial(): Promise<{ key: string; cert: string; ca: string }> {
  const ca = await generateAuthority('host', 'bench');
  const keys = generateKeyPair();
  const cert = await issueTlsCert(ca, { publicKeyPem: keys.publicKeyPem, identity: { kind: 'host', name: 'p', cluster: 'bench', roles: ['proxy'] }, dnsNames: ['localhost'], ttlMs: 3600_000, usage: 'both' });
  return { key: keys.privateKeyPem, cert, ca: ca.tls.certPem };
}

/** Server side of both: a sink counts bytes then ends; an echo writes back what it reads. */
function serve(stream: Duplex, mode: string): void {
  if (mode === 'echo') stream.pipe(stream);
  else {
    stream.on('data', () => undefined);
    stream.on('end', () => stream.end());
  }
}

async function startHttp2(m: { key: string; cert: string; ca: string }): Promise<Transport> {
  const server = http2.createSecureServer({ key: m.key, cert: m.cert, ca: m.ca, requestCert: true, rejectUnauthorized: true, noDelay: true });
  server.on('stream', (stream, headers) => {
    stream.respond({ ':status': 200 });
    serve(stream, String(headers['x-mode']));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as net.AddressInfo).port;
  const session = http2.connect(`https://localhost:${port}`, { key: m.key, cert: m.cert, ca: m.ca });
  await new Promise<void>((r, j) => session.once('connect', () => r()).once('error', j));
  return {
    name: 'http2',
    open: async (mode) => {
      const req = session.request({ ':method': 'POST', ':path': '/', 'x-mode': mode });
      await new Promise<void>((r) => req.once('response', () => r()));
      return req;
    },
    close: () => {
      session.destroy();
      server.close();
    },
  };
}

async function startSsh2(m: { key: string; cert: string; ca: string }): Promise<Transport> {
  const hostKey = sshPrivateKeyPem(generateKeyPair().privateKeyPem);
  const algorithms = { cipher: ['aes128-gcm@openssh.com' as const] };
  const sshServer = new ssh2.Server({ hostKeys: [hostKey], algorithms }, (conn) => {
    conn.on('authentication', (ctx) => ctx.accept());
    conn.on('tcpip', (accept, _reject, info) => serve(accept() as unknown as Duplex, info.destIP));
    conn.on('error', () => undefined);
  });
  const tlsServer = tls.createServer({ key: m.key, cert: m.cert, ca: m.ca, requestCert: true, rejectUnauthorized: true, noDelay: true }, (s) => sshServer.injectSocket(s as never));
  await new Promise<void>((r) => tlsServer.listen(0, '127.0.0.1', r));
  const port = (tlsServer.address() as net.AddressInfo).port;
  const sock = tls.connect({ port, host: '127.0.0.1', servername: 'localhost', key: m.key, cert: m.cert, ca: m.ca });
  sock.setNoDelay(true);
  await new Promise<void>((r, j) => sock.once('secureConnect', () => r()).once('error', j));
  const client = new ssh2.Client();
  await new Promise<void>((r, j) => client.once('ready', () => r()).once('error', j).connect({ sock, username: 'p', algorithms }));
  return {
    name: 'ssh2',
    open: (mode) => new Promise((r, j) => client.forwardOut('127.0.0.1', 1, mode, 1, (err, ch) => (err ? j(err) : r(ch as unknown as Duplex)))),
    close: () => {
      client.end();
      tlsServer.close();
    },
  };
}

/** A TLS connection per stream (no multiplexing): its first line says sink or echo. */
async function startTlsPerStream(m: { key: string; cert: string; ca: string }): Promise<Transport> {
  const server = tls.createServer({ key: m.key, cert: m.cert, ca: m.ca, requestCert: true, rejectUnauthorized: true, noDelay: true }, (s) => {
    let head = Buffer.alloc(0);
    const onData = (d: Buffer) => {
      head = Buffer.concat([head, d]);
      const nl = head.indexOf(10);
      if (nl < 0) return;
      s.off('data', onData);
      s.pause();
      const rest = head.subarray(nl + 1);
      if (rest.length) s.unshift(rest);
      serve(s, head.subarray(0, nl).toString());
      s.resume();
    };
    s.on('data', onData);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as net.AddressInfo).port;
  const secureContext = tls.createSecureContext({ key: m.key, cert: m.cert, ca: m.ca });
  let session: Buffer | undefined;
  return {
    name: 'tls',
    open: (mode) =>
      new Promise((r, j) => {
        const sock = tls.connect({ port, host: '127.0.0.1', servername: 'localhost', secureContext, ...(session ? { session } : {}) });
        sock.setNoDelay(true); // as the Dialer's sockets
        sock.on('session', (s: Buffer) => (session = s));
        sock.once('secureConnect', () => {
          sock.write(`${mode}\n`);
          r(sock);
        }).once('error', j);
      }),
    close: () => server.close(),
  };
}

/** MiB/s of pushing MIB MiB on one stream until the far end has read them all (it ends its side then). */
async function throughput(t: Transport): Promise<number> {
  return pushToSink(await t.open('sink'), MIB * 1024 * 1024, CHUNK);
}

/** ms to open an echo stream and get a first 64 bytes back, OPENS times in a row. */
async function opens(t: Transport): Promise<number[]> {
  const out: number[] = [];
  const msg = Buffer.alloc(64, 1);
  for (let i = 0; i < OPENS; i++) {
    const start = process.hrtime.bigint();
    const stream = await t.open('echo');
    await new Promise<void>((resolve) => {
      let got = 0;
      stream.on('data', (c: Buffer) => {
        got += c.length;
        if (got >= 64) resolve();
      });
      stream.write(msg);
    });
    out.push(Number(process.hrtime.bigint() - start) / 1e6);
    stream.destroy();
  }
  return out.sort((a, b) => a - b);
}

/** 64-byte round trips on one stream, µs. */
async function roundTrips(t: Transport): Promise<number[]> {
  const stream = await t.open('echo');
  const out: number[] = [];
  for (let i = 0; i < RTTS; i++) out.push(await echoOnce(stream));
  stream.destroy();
  return out.sort((a, b) => a - b);
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const pct = (xs: number[], p: number) => xs[Math.min(xs.length - 1, Math.floor((xs.length * p) / 100))]!;

async function main(): Promise<void> {
  const load = loadavg()[0]!.toFixed(2);
  const m = await tlsMaterial();
  const transports = [await startHttp2(m), await startSsh2(m), ...(process.env.BENCH_TLS ? [await startTlsPerStream(m)] : [])];
  const tp = new Map<string, number[]>(transports.map((t) => [t.name, []]));
  for (let run = 0; run < RUNS; run++) for (const t of transports) tp.get(t.name)!.push(await throughput(t));
  const rtt = new Map<string, number[]>();
  for (const t of transports) rtt.set(t.name, await roundTrips(t));
  const open = new Map<string, number[]>();
  for (const t of transports) open.set(t.name, await opens(t));
  for (const t of transports) t.close();
  const rows = transports.map((t) => `| ${t.name} | ${median(tp.get(t.name)!).toFixed(0)} | ${pct(rtt.get(t.name)!, 50).toFixed(1)} | ${pct(rtt.get(t.name)!, 99).toFixed(1)} | ${pct(open.get(t.name)!, 50).toFixed(2)} |`);
  const ratio = (a: string, b: string) =>
    `- ${a} / ${b}: throughput ${(median(tp.get(a)!) / median(tp.get(b)!)).toFixed(2)}x, round trip p50 ${(pct(rtt.get(a)!, 50) / pct(rtt.get(b)!, 50)).toFixed(2)}x, open + first round trip p50 ${(pct(open.get(a)!, 50) / pct(open.get(b)!, 50)).toFixed(2)}x.`;
  const section = [
    '## peer-transport',
    '',
    `Run ${new Date().toISOString()} with \`${process.env.BENCH_TLS ? 'BENCH_TLS=1 ' : ''}npx tsx bench/peer-transport.ts\`: the transports over TLS 1.3 with client certificates on loopback, client and server in one process; ${MIB} MiB per run on one stream (median of ${RUNS}, interleaved), ${RTTS} round trips of 64 bytes on one stream, ${OPENS} sequential opens of a stream with its first 64-byte round trip (tls: a new connection resuming the last session). ssh2 uses aes128-gcm@openssh.com (the tunnels' cipher) inside TLS. Load average ${load} at the start, ${loadavg()[0]!.toFixed(2)} at the end (other work shared the machine).`,
    '',
    '| transport | throughput, 1 stream (MiB/s) | 64-byte round trip p50 (µs) | p99 (µs) | open + first round trip p50 (ms) |',
    '|---|---|---|---|---|',
    ...rows,
    '',
    ratio('http2', 'ssh2'),
    ...(open.has('tls') ? [ratio('tls', 'http2')] : []),
    '',
  ].join('\n');
  process.stdout.write(section);
  if (process.env.BENCH_RECORD === '1') await recordSection('peer-transport', section);
}

await main();
process.exit(0);
