/**
 * Self-test of the test helpers: real squids (plain, auth, CONNECT port
 * policy, https proxy) tunnelling by hand-written CONNECT to a real echo server.
 */
import { readdirSync } from 'node:fs';
import * as net from 'node:net';
import * as tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAccessLogLine, squidArgs, startSquid, type Squid, type SquidOptions } from './squid.js';
import { startEchoServer, startSinkServer, startSourceServer, type TestServer } from './servers.js';
import { makeTestPki, type TestPki } from './tls.js';

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  await Promise.allSettled(cleanups.reverse().map((c) => c()));
});

async function squid(options: SquidOptions = {}): Promise<Squid> {
  const s = await startSquid(options);
  cleanups.push(s.stop);
  return s;
}

/** Sends a CONNECT by hand and reads the response head; bytes after it are left in the socket. */
function sendConnect(
  socket: net.Socket,
  target: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; head: string }> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const onData = (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      socket.off('data', onData);
      socket.off('error', reject);
      socket.pause();
      const rest = buf.subarray(end + 4);
      if (rest.length > 0) socket.unshift(rest);
      const head = buf.subarray(0, end).toString('latin1');
      resolve({ status: Number(head.split(' ')[1]), head });
    };
    socket.on('data', onData);
    socket.once('error', reject);
    const extra = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('');
    socket.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${extra}\r\n`);
  });
}

function tcp(host: string, port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, host, () => resolve(s));
    s.once('error', reject);
  });
}

/** Writes `text`, half-closes, and collects everything until the peer closes. */
function roundTrip(socket: net.Socket, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let got = '';
    socket.on('data', (d: Buffer) => {
      got += d.toString();
      if (got.length >= text.length) socket.end();
    });
    socket.once('close', () => resolve(got));
    socket.once('error', reject);
    socket.resume();
    socket.write(text);
  });
}

const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;

let echo: TestServer;
let localEcho: TestServer;

beforeAll(async () => {
  echo = await startEchoServer('127.0.0.3');
  localEcho = await startEchoServer('127.0.0.1');
  cleanups.push(echo.close, localEcho.close);
});

describe('startSquid', () => {
  it('tunnels a CONNECT to an IP literal on another loopback address and logs it', async () => {
    const proxy = await squid();
    expect(proxy.host).toBe('127.0.0.2');
    expect(proxy.url).toBe(`http://127.0.0.2:${proxy.port}`);

    const socket = await tcp(proxy.host, proxy.port);
    const { status, head } = await sendConnect(socket, `127.0.0.3:${echo.port}`);
    expect(status, head).toBe(200);
    expect(await roundTrip(socket, 'hello through squid')).toBe('hello through squid');

    const line = await proxy.waitForAccessLog((l) => l.includes(`CONNECT 127.0.0.3:${echo.port} 200`), 10_000);
    const entry = parseAccessLogLine(line);
    expect(entry).toMatchObject({ method: 'CONNECT', url: `127.0.0.3:${echo.port}`, status: 200, user: undefined });
    expect(entry.bytesToClient).toBeGreaterThan(0);
    // Readiness probes are not logged: the tunnel is the only line.
    expect(await proxy.readAccessLog()).toEqual([line]);
  });

  it('two at once each name their shared memory after a service of their own, so they never share a segment', async () => {
    // With squid's default service name both would use /dev/shm/squid-*.shm: a squid of another user (or of an
    // older run of these tests) then keeps this user's squid from starting at all.
    const [a, b] = await Promise.all([squid(), squid()]);
    const segments = readdirSync('/dev/shm');
    const [nameA, nameB] = [a, b].map((s) => squidArgs(s.dir)[squidArgs(s.dir).indexOf('-n') + 1]!);
    expect(nameA).not.toBe(nameB);
    for (const name of [nameA, nameB]) expect(segments.filter((f) => f.startsWith(`${name}-`))).not.toEqual([]);
  });

  it('resolves localhost from /etc/hosts without DNS', async () => {
    const proxy = await squid();
    const socket = await tcp(proxy.host, proxy.port);
    const { status, head } = await sendConnect(socket, `localhost:${localEcho.port}`);
    expect(status, head).toBe(200);
    expect(await roundTrip(socket, 'via localhost')).toBe('via localhost');
  });

  it('requires basic auth when configured: 407 without or with wrong credentials, 200 with them', async () => {
    const proxy = await squid({ auth: { user: 'alice', password: 's3cret:with colon' } });
    const target = `127.0.0.3:${echo.port}`;

    const anon = await tcp(proxy.host, proxy.port);
    const r1 = await sendConnect(anon, target);
    expect(r1.status, r1.head).toBe(407);
    expect(r1.head).toMatch(/Proxy-Authenticate: Basic realm="gateway-test"/i);
    anon.destroy();

    const wrong = await tcp(proxy.host, proxy.port);
    const r2 = await sendConnect(wrong, target, { 'Proxy-Authorization': basic('alice', 'nope') });
    expect(r2.status, r2.head).toBe(407);
    wrong.destroy();

    const ok = await tcp(proxy.host, proxy.port);
    const r3 = await sendConnect(ok, target, { 'Proxy-Authorization': basic('alice', 's3cret:with colon') });
    expect(r3.status, r3.head).toBe(200);
    expect(await roundTrip(ok, 'authed')).toBe('authed');
    const line = await proxy.waitForAccessLog((l) => l.includes(`CONNECT ${target} 200`));
    expect(parseAccessLogLine(line).user).toBe('alice');
  });

  it('answers 403 for CONNECT to a port outside connectPorts', async () => {
    const proxy = await squid({ connectPorts: [443] });
    const socket = await tcp(proxy.host, proxy.port);
    const { status, head } = await sendConnect(socket, `127.0.0.3:${echo.port}`);
    expect(status, head).toBe(403);
    socket.destroy();
    await proxy.waitForAccessLog((l) => l.includes(`CONNECT 127.0.0.3:${echo.port} 403`));
  });

  describe('https proxy', () => {
    let pki: TestPki;
    beforeAll(async () => {
      pki = await makeTestPki();
      cleanups.push(pki.cleanup);
    });

    it('accepts CONNECT over TLS to the proxy itself', async () => {
      const cert = await pki.serverCert({ names: ['localhost'], ips: ['127.0.0.2'] });
      const proxy = await squid({ tls: { cert: cert.certPath, key: cert.keyPath } });
      expect(proxy.httpsUrl).toBe(`https://127.0.0.2:${proxy.httpsPort}`);

      const socket = await new Promise<tls.TLSSocket>((resolve, reject) => {
        const s = tls.connect({ host: proxy.host, port: proxy.httpsPort!, ca: pki.caPem }, () => resolve(s));
        s.once('error', reject);
      });
      expect(socket.authorized).toBe(true);
      const { status, head } = await sendConnect(socket, `127.0.0.3:${echo.port}`);
      expect(status, head).toBe(200);
      expect(await roundTrip(socket, 'tls to the proxy')).toBe('tls to the proxy');
      await proxy.waitForAccessLog((l) => l.includes(`CONNECT 127.0.0.3:${echo.port} 200`));
    });

    it('rejects a client that does not trust the test CA', async () => {
      const cert = await pki.serverCert({ names: [], ips: ['127.0.0.2'] });
      const proxy = await squid({ tls: { cert: cert.certPath, key: cert.keyPath } });
      const err = await new Promise<Error>((resolve) => {
        const s = tls.connect({ host: proxy.host, port: proxy.httpsPort! }, () => resolve(new Error('connected')));
        s.once('error', resolve);
      });
      expect((err as NodeJS.ErrnoException).code).toMatch(/SELF_SIGNED|UNABLE_TO_GET_ISSUER|UNABLE_TO_VERIFY/);
    });
  });

  it('bump: answers TLS inside a CONNECT itself, with a certificate minted for the host and signed by the CA given', async () => {
    const corp = await makeTestPki(undefined, { subject: '/CN=Helper Corp CA' });
    cleanups.push(corp.cleanup);
    const proxy = await squid({ bump: { caCert: corp.caCertPath, caKey: corp.caKeyPath }, extraConfig: ['ssl_bump bump all'] });
    const raw = await tcp(proxy.host, proxy.port);
    expect((await sendConnect(raw, `127.0.0.3:${echo.port}`)).status).toBe(200);
    // Client-first bumping: the handshake is squid's alone (the echo server behind it speaks no TLS).
    const socket = await new Promise<tls.TLSSocket>((resolve, reject) => {
      const s = tls.connect({ socket: raw, ca: corp.caPem, checkServerIdentity: () => undefined }, () => resolve(s));
      s.once('error', reject);
    });
    expect(socket.authorized).toBe(true);
    expect(socket.getPeerCertificate().issuer.CN).toBe('Helper Corp CA');
    expect(socket.getPeerCertificate().subject.CN).toBe('127.0.0.3');
    socket.destroy();
  });

  it('carries bulk data intact both ways (sink and source servers)', async () => {
    const proxy = await squid();
    const sink = await startSinkServer('127.0.0.3');
    const source = await startSourceServer('127.0.0.3', 3 << 20);
    cleanups.push(sink.close, source.close);

    const up = await tcp(proxy.host, proxy.port);
    expect((await sendConnect(up, `127.0.0.3:${sink.port}`)).status).toBe(200);
    const payload = Buffer.alloc(2 << 20, 7);
    up.resume();
    up.end(payload);
    const received = await sink.result(0);
    expect(received.bytes).toBe(payload.length);

    const down = await tcp(proxy.host, proxy.port);
    expect((await sendConnect(down, `127.0.0.3:${source.port}`)).status).toBe(200);
    const chunks: Buffer[] = [];
    down.on('data', (d: Buffer) => chunks.push(d));
    down.resume();
    await new Promise((r) => down.once('close', r));
    expect(Buffer.concat(chunks).equals(source.data)).toBe(true);
  });
});
