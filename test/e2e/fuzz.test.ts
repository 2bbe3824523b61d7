/**
 * Fuzz and soak of the Proxy's entry points, bounded in count and time, against real daemons on loopback:
 * generated SSH banners and key-exchange packets on every listener that speaks SSH (the tunnel port 3024, the SSH
 * port 3023, SSH on the one port), and generated request bodies on the unauthenticated HTTP API. The daemon must
 * stay up and answer /webapi/ping, never answer 5xx, and hold no connection of the fuzzer once it has gone (its
 * descriptor count returns to its baseline).
 */
import { readdirSync } from 'node:fs';
import net from 'node:net';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGateway, type RunningGateway } from '../helpers/gateway.js';
import { separateListenLines } from '../helpers/listeners.js';

let separate: RunningGateway;
let multiplex: RunningGateway;

const CONFIG = (mode: 'separate' | 'multiplex') =>
  [
    'gateway:',
    '  data_dir: DATA_DIR',
    '  log: { format: json }',
    'auth_service:',
    '  listen_addr: 127.0.0.1:0',
    `  proxy_listener_mode: ${mode}`,
    'proxy_service:',
    '  web_listen_addr: 127.0.0.1:0',
    // Separate mode opens every listener; each on a free port of its own.
    ...(mode === 'separate' ? separateListenLines('127.0.0.1', { optional: true }) : []),
    '',
  ].join('\n');

beforeAll(async () => {
  [separate, multiplex] = await Promise.all([startGateway(CONFIG('separate')), startGateway(CONFIG('multiplex'))]);
}, 60_000);

afterAll(async () => {
  await Promise.all([separate?.stop(), multiplex?.stop()]);
});

const fds = (gw: RunningGateway) => readdirSync(`/proc/${gw.process.pid}/fd`).length;
const hostPort = (addr: string) => ({ host: addr.slice(0, addr.lastIndexOf(':')), port: Number(addr.slice(addr.lastIndexOf(':') + 1)) });

/** Sends bytes, half-closes or closes, and resolves once the server has closed or 0.5 s have passed. */
function sendAndLeave(addr: string, bytes: Uint8Array, how: 'end' | 'destroy'): Promise<void> {
  return new Promise((resolve) => {
    const s = net.connect(hostPort(addr), () => {
      s.write(bytes);
      if (how === 'end') s.end();
      else setImmediate(() => s.destroy());
    });
    s.on('data', () => undefined);
    s.on('error', () => resolve());
    s.on('close', () => resolve());
    setTimeout(() => {
      s.destroy();
      resolve();
    }, 500).unref();
  });
}

async function untilBack(gw: RunningGateway, baseline: number, timeoutMs = 45_000): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  let n = fds(gw);
  while (n > baseline && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 250));
    n = fds(gw);
  }
  return n;
}

async function pingOk(gw: RunningGateway): Promise<number> {
  const res = await fetch(`https://${gw.addresses.web}/webapi/ping`, { dispatcher: undefined } as RequestInit).catch(() => undefined);
  return res?.status ?? 0;
}

/** An SSH binary packet: uint32 length, padding length, payload, padding. */
function packet(payload: Uint8Array, padding: number): Uint8Array {
  const len = 1 + payload.length + padding;
  const out = Buffer.alloc(4 + len);
  out.writeUInt32BE(len, 0);
  out[4] = padding;
  Buffer.from(payload).copy(out, 5);
  return out;
}

const banner = fc.oneof(
  fc.constant('SSH-2.0-x\r\n'),
  fc.string({ maxLength: 300 }).map((s) => `SSH-2.0-${s}\r\n`),
  fc.string({ maxLength: 300 }).map((s) => `SSH-${s}\n`),
  fc.string({ minLength: 1, maxLength: 4096 }),
  fc.array(fc.string({ maxLength: 80 }), { maxLength: 40 }).map((lines) => `${lines.join('\r\n')}\r\nSSH-2.0-fuzz\r\n`),
);
const kex = fc.oneof(
  fc.uint8Array({ maxLength: 2048 }).map((p) => packet(Uint8Array.from([20, ...p]), 4)),
  fc.tuple(fc.uint8Array({ maxLength: 512 }), fc.integer({ min: 0, max: 255 })).map(([p, pad]) => packet(p, pad)),
  fc.uint8Array({ minLength: 4, maxLength: 64 }).map((b) => {
    const out = Buffer.from(b);
    out.writeUInt32BE(0xffffff00, 0); // a huge length
    return out;
  }),
);
const sshInput = fc.tuple(banner, fc.option(kex, { nil: undefined }), fc.constantFrom<'end' | 'destroy'>('end', 'destroy'));

describe('SSH entry points under generated banners and key-exchange packets', () => {
  for (const [name, gw, key] of [
    ['the tunnel port (3024)', () => separate, 'proxy_tunnel'],
    ['the SSH port (3023)', () => separate, 'proxy_ssh'],
    ['SSH on the one port', () => multiplex, 'web'],
  ] as const) {
    it(`${name}: the Proxy stays up and keeps no connection of the fuzzer`, async () => {
      const daemon = gw();
      const addr = daemon.addresses[key]!;
      expect(addr, `${key} in ${JSON.stringify(daemon.addresses)}`).toBeDefined();
      const baseline = fds(daemon);
      await fc.assert(
        fc.asyncProperty(sshInput, async ([b, k, how]) => {
          const bytes = Buffer.concat([Buffer.from(b, 'utf8'), k ? Buffer.from(k) : Buffer.alloc(0)]);
          await sendAndLeave(addr, bytes, how);
        }),
        { numRuns: 120 },
      );
      expect(daemon.process.exitCode).toBeNull();
      expect(await untilBack(daemon, baseline)).toBeLessThanOrEqual(baseline);
    }, 120_000);
  }
});

describe('the HTTP API under generated bodies', () => {
  const json = fc.jsonValue({ maxDepth: 6 });
  const loginish = fc.record(
    { username: fc.oneof(fc.string(), json), password: fc.oneof(fc.string(), json), public_key: fc.oneof(fc.string(), json), ssh_public_key: fc.oneof(fc.string(), json), ttl_ms: json },
    { requiredKeys: [] },
  );
  const joinish = fc.record(
    { token: fc.oneof(fc.string(), json), roles: fc.oneof(fc.array(fc.string()), json), nodename: fc.oneof(fc.string(), json), public_key: fc.oneof(fc.string(), json), ssh_public_key: fc.oneof(fc.string(), json), public_addrs: json },
    { requiredKeys: [] },
  );
  const body = fc.oneof(
    loginish.map((v) => JSON.stringify(v)),
    joinish.map((v) => JSON.stringify(v)),
    json.map((v) => JSON.stringify(v)),
    fc.string({ maxLength: 2000 }),
    fc.integer({ min: 1, max: 2000 }).map((n) => '['.repeat(n)),
  );

  it('/webapi/login and /webapi/join answer every body with a 4xx and a code, never 5xx; the daemon stays up', async () => {
    const base = `https://${separate.addresses.web}`;
    // Test certificates are from the cluster's own CA: this fuzz is about bodies, not TLS trust.
    process.env.NODE_TLS_REJECT_UNAUTHORIZED = '0';
    try {
      await fc.assert(
        fc.asyncProperty(fc.constantFrom('/webapi/login', '/webapi/join'), body, async (path, text) => {
          const res = await fetch(`${base}${path}`, { method: 'POST', body: text, headers: { 'content-type': 'application/json' } });
          const payload = (await res.json()) as { error?: { code?: string } };
          expect(res.status, `${path} ${text.slice(0, 200)}`).toBeGreaterThanOrEqual(400);
          expect(res.status, `${path} ${text.slice(0, 200)} -> ${JSON.stringify(payload)}`).toBeLessThan(500);
          expect(payload.error?.code).toMatch(/^GW_ERR_/);
        }),
        { numRuns: 200 },
      );
      expect(await pingOk(separate)).toBe(200);
    } finally {
      delete process.env.NODE_TLS_REJECT_UNAUTHORIZED;
    }
  }, 120_000);
});
