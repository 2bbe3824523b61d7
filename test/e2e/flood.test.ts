/**
 * Issue 11, "Hardening": caps on what one source can hold. The daemon runs under `ulimit -n 256` (with the
 * default caps, which that limit sizes, and with caps written in the file); one source
 * (one loopback address) opens 300 connections to one listener and holds them (an SSH version line and
 * silence, or nothing at all on the one port, with deadlines far longer than the test). With the caps the
 * flood gets its share and no more: the web port and the Auth API keep answering other requests, and the
 * daemon logs that a cap was reached. Before the caps the flood took every descriptor and both went dead.
 *
 * Bounded: 300 connections per test, loopback only, closed at the end of each test.
 */
import { readFileSync } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { defaultMaxConnections, defaultMaxConnectionsPerSource } from '../../src/net/source.js';
import { startGateway, type RunningGateway } from '../helpers/gateway.js';
import { separateListenLines } from '../helpers/listeners.js';

const OPEN_FILES = 256;
const FLOOD = 300;

/** caps: written in the file; without, the defaults, which the open-file limit sizes (8 per source at 256). */
function yaml(mode: 'multiplex' | 'separate', caps?: { total: number; perSource: number }): string {
  return [
    'gateway:',
    `  nodename: flood-${mode}`,
    '  data_dir: DATA_DIR',
    '  log: { format: json }',
    '  limits:',
    // Long deadlines: what holds the flood back here must be the caps, not a deadline.
    '    ssh_handshake_timeout: 2m',
    '    header_timeout: 2m',
    '    tls_handshake_timeout: 2m',
    ...(caps ? [`    max_connections: ${caps.total}`, `    max_connections_per_source: ${caps.perSource}`] : []),
    'auth_service:',
    '  cluster_name: flood.example',
    '  listen_addr: 127.0.0.1:0',
    `  proxy_listener_mode: ${mode}`,
    'proxy_service:',
    '  web_listen_addr: 127.0.0.1:0',
    '  detect_timeout: 2m',
    ...(mode === 'separate' ? separateListenLines('127.0.0.1') : []),
    '',
  ].join('\n');
}

const portOf = (addr: string): number => Number(addr.split(':').pop());

/** The daemon's own soft open-file limit, as the kernel states it. */
const openFileLimit = (g: RunningGateway): number => Number(/^Max open files\s+(\d+)/m.exec(readFileSync(`/proc/${g.process.pid}/limits`, 'utf8'))?.[1]);

let gw: RunningGateway | undefined;
const flood: net.Socket[] = [];
afterEach(async () => {
  for (const s of flood.splice(0)) s.destroy();
  await gw?.stop();
  gw = undefined;
});

/** Opens `n` connections from `from`, each writing `first` (if any) and holding on; resolves once all settled. */
async function openFlood(port: number, from: string, n: number, first?: string): Promise<void> {
  await Promise.all(
    Array.from(
      { length: n },
      () =>
        new Promise<void>((resolve) => {
          const s = net.connect({ host: '127.0.0.1', port, localAddress: from });
          flood.push(s);
          s.on('error', () => resolve());
          s.once('close', () => resolve());
          s.once('connect', () => {
            if (first) s.write(first);
            // Give the daemon a moment to accept (or refuse) it before counting it as settled.
            setTimeout(resolve, 200);
          });
          s.resume();
        }),
    ),
  );
}

/** An HTTPS GET from `from`: the status, or the error's code when it fails. */
function get(port: number, path: string, from = '127.0.0.1'): Promise<number | string> {
  return new Promise((resolve) => {
    const req = https.get({ host: '127.0.0.1', port, path, localAddress: from, rejectUnauthorized: false, servername: 'localhost', agent: false, timeout: 10_000 }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('timeout', () => req.destroy(Object.assign(new Error('timeout'), { code: 'TIMEOUT' })));
    req.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
}

describe(`under ulimit -n ${OPEN_FILES}, a flood of ${FLOOD} connections from one source`, () => {
  it('on the SSH port leaves the web port and the Auth API answering, and logs the cap (default caps)', async () => {
    gw = await startGateway(yaml('separate'), { openFiles: OPEN_FILES });
    expect(openFileLimit(gw)).toBe(OPEN_FILES);
    const web = portOf(gw.addresses.web!);
    const authApi = portOf(gw.addresses.auth!);
    await openFlood(portOf(gw.addresses.proxy_ssh!), '127.0.0.2', FLOOD, 'SSH-2.0-x\r\n');
    expect(await get(web, '/webapi/ping')).toBe(200);
    expect(await get(authApi, '/webapi/ca')).toBe(200);
    const line = JSON.parse(await gw.waitForLog('"connection refused: cap reached"')) as Record<string, unknown>;
    expect(line).toMatchObject({ listener: 'ssh', cap: 'per_source', limit: defaultMaxConnectionsPerSource(defaultMaxConnections(OPEN_FILES)), source: '127.0.0.2' });
    expect(gw.process.exitCode).toBeNull();
  }, 60_000);

  it('on the one port leaves it answering another source, and the Auth API too (caps written in the file)', async () => {
    gw = await startGateway(yaml('multiplex', { total: 30, perSource: 20 }), { openFiles: OPEN_FILES });
    expect(openFileLimit(gw)).toBe(OPEN_FILES);
    const web = portOf(gw.addresses.web!);
    await openFlood(web, '127.0.0.2', FLOOD);
    expect(await get(web, '/webapi/ping', '127.0.0.3')).toBe(200);
    expect(await get(portOf(gw.addresses.auth!), '/webapi/ca')).toBe(200);
    const line = JSON.parse(await gw.waitForLog('"connection refused: cap reached"')) as Record<string, unknown>;
    expect(line).toMatchObject({ listener: 'web', cap: 'per_source', limit: 20, source: '127.0.0.2' });
    expect(gw.process.exitCode).toBeNull();
  }, 60_000);
});
