/**
 * Clients resume TLS sessions (undici, curl and browsers send the session of an earlier connection): every TLS
 * endpoint that terminates TLS by hand (src/net/tls.ts) must accept a resumed session, not answer it with an
 * internal_error alert as it did while its secure context had no session ID context.
 */
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGateway, type RunningGateway } from '../helpers/gateway.js';
import { separateListenLines } from '../helpers/listeners.js';

let multiplex: RunningGateway;
let separate: RunningGateway;

const CONFIG = (mode: string, extra: string[] = []) =>
  ['gateway:', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  listen_addr: 127.0.0.1:0', `  proxy_listener_mode: ${mode}`, 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', ...extra, ''].join('\n');

beforeAll(async () => {
  [multiplex, separate] = await Promise.all([
    startGateway(CONFIG('multiplex')),
    startGateway(CONFIG('separate', separateListenLines('127.0.0.1', { optional: true }))),
  ]);
}, 60_000);
afterAll(async () => {
  await Promise.all([multiplex?.stop(), separate?.stop()]);
});

/** One GET /webapi/ca (served on the web port and the Auth API) on a connection that offers `session`; resolves with the status line and the session. */
function ping(addr: string, version: 'TLSv1.2' | 'TLSv1.3', session?: Buffer): Promise<{ status: string; reused: boolean; session?: Buffer }> {
  const [host, port] = [addr.slice(0, addr.lastIndexOf(':')), Number(addr.slice(addr.lastIndexOf(':') + 1))];
  return new Promise((resolve, reject) => {
    let got: Buffer | undefined;
    const s = tls.connect({ host, port, rejectUnauthorized: false, minVersion: version, maxVersion: version, ALPNProtocols: ['http/1.1'], ...(session ? { session } : {}) });
    s.on('session', (sess: Buffer) => (got = sess));
    let text = '';
    let reused = false;
    s.on('secureConnect', () => {
      reused = s.isSessionReused();
      s.write(`GET /webapi/ca HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
    });
    s.on('data', (c: Buffer) => (text += c.toString()));
    s.on('error', reject);
    s.on('close', () => resolve({ status: text.split('\r\n')[0] ?? '', reused, ...(got ? { session: got } : {}) }));
  });
}

describe('resumed TLS sessions', () => {
  for (const version of ['TLSv1.2', 'TLSv1.3'] as const) {
    for (const [name, addr] of [
      ['the one port', () => multiplex.addresses.web!],
      ['the separate web port', () => separate.addresses.web!],
      ['the Auth API', () => multiplex.addresses.auth!],
    ] as const) {
      it(`${name}, ${version}: a second connection resumes the first one's session and is served`, async () => {
        const first = await ping(addr(), version);
        expect(first.status).toBe('HTTP/1.1 200 OK');
        expect(first.session).toBeDefined();
        const second = await ping(addr(), version, first.session);
        expect(second.status).toBe('HTTP/1.1 200 OK');
        expect(second.reused).toBe(true);
      });
    }
  }
});
