/**
 * A bulk-transfer app for tunnel tests, checked with sha256 at both ends.
 *
 * The server is a small standalone Node script (BULK_SERVER_SOURCE, run with `node FILE PORT [HOST]`, e.g.
 * inside a network namespace). Per connection:
 *
 *   client → server   one JSON line {"id", "upload": N, "download": M, "seed": S}, then N bytes
 *   server → client   M bytes of the AES-128-CTR keystream of seed S ^ 0x80 (pseudoRandomBytes of servers.ts),
 *                     then, once all N bytes arrived, one JSON line
 *                     {"id", "received": {"bytes", "sha256"}, "sent": {"bytes", "sha256"}} and the end
 *
 * The server also prints that line on its standard output, so both what it received and what it sent are
 * reported by the far end. Nothing depends on half-close (squid does not relay it).
 *
 * transfer() is the client: it sends N keystream bytes of seed S (hashing them as it goes), hashes the M bytes
 * it receives, and returns its own hashes and the server's report.
 */
import type { ChildProcess } from 'node:child_process';
import { createCipheriv, createHash } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import net from 'node:net';
import { join } from 'node:path';
import { eventually } from './wait.js';

export const BULK_SERVER_SOURCE = String.raw`
import net from 'node:net';
import { createCipheriv, createHash } from 'node:crypto';
import { once } from 'node:events';
const port = Number(process.argv[2]);
const host = process.argv[3] || '127.0.0.1';
const CHUNK = 256 * 1024;
const keystream = (seed) => {
  const c = createCipheriv('aes-128-ctr', Buffer.alloc(16, seed & 0xff), Buffer.alloc(16));
  const zeros = Buffer.alloc(CHUNK);
  return (n) => c.update(n === CHUNK ? zeros : Buffer.alloc(n));
};
const server = net.createServer({ allowHalfOpen: true, noDelay: true }, (s) => {
  s.on('error', () => {});
  let head = Buffer.alloc(0);
  let req;
  let received = 0;
  const hin = createHash('sha256');
  let uploadDone;
  const uploaded = new Promise((r) => (uploadDone = r));
  const report = (sent) => ({ id: req.id, received: { bytes: received, sha256: hin.copy().digest('hex') }, sent });
  s.on('data', (d) => {
    if (!req) {
      head = Buffer.concat([head, d]);
      const nl = head.indexOf(10);
      if (nl < 0) return;
      req = JSON.parse(head.subarray(0, nl).toString());
      d = head.subarray(nl + 1);
      void serve();
    }
    received += d.length;
    hin.update(d);
    if (received >= req.upload) uploadDone();
  });
  s.on('close', () => {
    if (req && received < req.upload) console.log(JSON.stringify({ ...report(null), error: 'closed early' }));
  });
  async function serve() {
    if (received >= req.upload) uploadDone();
    const next = keystream(req.seed ^ 0x80);
    const hout = createHash('sha256');
    let sent = 0;
    while (sent < req.download && !s.destroyed) {
      const chunk = next(Math.min(CHUNK, req.download - sent));
      hout.update(chunk);
      sent += chunk.length;
      if (!s.write(chunk)) await Promise.race([once(s, 'drain'), once(s, 'close')]);
    }
    await uploaded;
    const line = JSON.stringify(report({ bytes: sent, sha256: hout.digest('hex') }));
    console.log(line);
    s.end(line + '\n');
  }
});
server.listen(port, host, () => console.log(JSON.stringify({ listening: port })));
`;

export interface BulkReport {
  id: number;
  received: { bytes: number; sha256: string };
  sent: { bytes: number; sha256: string };
}

export interface TransferResult {
  /** What this end sent and received. */
  sent: { bytes: number; sha256: string };
  received: { bytes: number; sha256: string };
  /** What the server says it received and sent. */
  server: BulkReport;
}

const CHUNK = 256 * 1024;

/** The keystream of seed, as `pseudoRandomBytes` of servers.ts makes it, in chunks. */
function keystream(seed: number): (n: number) => Buffer {
  const c = createCipheriv('aes-128-ctr', Buffer.alloc(16, seed & 0xff), Buffer.alloc(16));
  const zeros = Buffer.alloc(CHUNK);
  return (n) => c.update(n === CHUNK ? zeros : Buffer.alloc(n));
}

/** sha256 of the n bytes the server sends for seed: what a byte-exact download hashes to. */
export function expectedDownloadSha256(n: number, seed: number): string {
  const next = keystream(seed ^ 0x80);
  const h = createHash('sha256');
  for (let done = 0; done < n; ) {
    const chunk = next(Math.min(CHUNK, n - done));
    h.update(chunk);
    done += chunk.length;
  }
  return h.digest('hex');
}

/**
 * One transfer through host:port (e.g. a `gwsh proxy app` listener); rejects after timeoutMs. With `hold`, the
 * upload stops once `holdAt` bytes are sent until hold resolves: a test that cuts the path mid-transfer cuts it
 * while the transfer is surely under way, however fast the path is.
 */
export function transfer(
  host: string,
  port: number,
  o: { id: number; upload: number; download: number; seed: number; timeoutMs?: number; holdAt?: number; hold?: Promise<unknown> },
): Promise<TransferResult> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host, port, noDelay: true });
    const hout = createHash('sha256');
    const hin = createHash('sha256');
    let sent = 0;
    let received = 0;
    let tail = Buffer.alloc(0);
    let settled = false;
    const finish = (err: Error | undefined, value?: TransferResult) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      if (err) reject(err);
      else resolve(value!);
    };
    const timer = setTimeout(
      () => finish(new Error(`transfer ${o.id}: not done within ${o.timeoutMs ?? 120_000} ms (sent ${sent} of ${o.upload}, received ${received} of ${o.download})`)),
      o.timeoutMs ?? 120_000,
    );
    socket.on('error', (err) => finish(new Error(`transfer ${o.id}: ${err.message} (sent ${sent}, received ${received})`)));
    socket.on('data', (d: Buffer) => {
      const want = o.download - received;
      const body = d.subarray(0, Math.max(0, Math.min(want, d.length)));
      if (body.length > 0) {
        hin.update(body);
        received += body.length;
      }
      if (body.length < d.length) tail = Buffer.concat([tail, d.subarray(body.length)]);
      const nl = tail.indexOf(0x0a);
      if (nl >= 0) {
        let server: BulkReport;
        try {
          server = JSON.parse(tail.subarray(0, nl).toString()) as BulkReport;
        } catch {
          return finish(new Error(`transfer ${o.id}: the server's report is not JSON: ${tail.subarray(0, 200).toString()}`));
        }
        finish(undefined, { sent: { bytes: sent, sha256: hout.digest('hex') }, received: { bytes: received, sha256: hin.digest('hex') }, server });
      }
    });
    socket.on('close', () => finish(new Error(`transfer ${o.id}: closed before the server's report (sent ${sent} of ${o.upload}, received ${received} of ${o.download})`)));
    socket.once('connect', () => {
      socket.write(`${JSON.stringify({ id: o.id, upload: o.upload, download: o.download, seed: o.seed })}\n`);
      const next = keystream(o.seed);
      let held = false;
      const pump = () => {
        while (sent < o.upload && !settled) {
          if (o.hold && !held && sent >= (o.holdAt ?? 0)) {
            held = true;
            void o.hold.then(pump);
            return;
          }
          const chunk = next(Math.min(CHUNK, o.upload - sent));
          hout.update(chunk);
          sent += chunk.length;
          if (!socket.write(chunk)) {
            socket.once('drain', pump);
            return;
          }
        }
      };
      pump();
    });
  });
}

/**
 * Writes the bulk server into dir and starts it on 127.0.0.1:port with spawnIt (e.g. inside a network namespace);
 * resolves once it listens (10 s at most; the error holds what it printed).
 */
export async function startBulkServer(dir: string, port: number, spawnIt: (command: string, args: string[]) => ChildProcess): Promise<ChildProcess> {
  const script = join(dir, 'bulk-server.mjs');
  await writeFile(script, BULK_SERVER_SOURCE);
  const child = spawnIt(process.execPath, [script, String(port), '127.0.0.1']);
  let output = '';
  child.stdout?.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr?.on('data', (c: Buffer) => (output += c.toString()));
  await eventually('the bulk server listens', async () => {
    if (!output.includes('"listening"')) throw new Error(output);
  }, 10_000);
  return child;
}
