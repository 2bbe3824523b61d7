/**
 * The Dialer against a real squid (Debian package) on loopback. Targets are names that only squid's own hosts
 * file knows (so a direct dial could not reach them by accident: the Dialer's resolver is given the same names
 * only where a test wants a direct dial), plus a test host in a network namespace for IP / CIDR entries (root
 * only: loopback targets are never proxied, so those entries need a target that is not loopback).
 */
import { createHash } from 'node:crypto';
import dns from 'node:dns';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fetchThroughDialer } from '../../src/dial/agent.js';
import { Dialer, type DialerOptions } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { curl } from '../helpers/curl.js';
import { createTestHost } from '../helpers/netns.js';
import { rootTest } from '../helpers/root.js';
import { pseudoRandomBytes, startEchoServer, startHttpsServer, startSinkServer, type SinkServer, type TestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { eventually } from '../helpers/wait.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { captureLogs } from '../helpers/logs.js';
import { dialError } from '../helpers/dial.js';

// Every log line of the code under test, so that the secrets test can read them all.
const logLines = captureLogs();

const TARGET_IP = '127.0.0.3';
const NAMES = ['echo.gw.test', 'direct.gw.test', 'a.svc.gw.test', 'port.gw.test', 'marker.gw.test', 'sink.gw.test', 'web.gw.test', 'proxy.gw.test'];
const PASSWORD = 'Sq%u1d-s3cret@pw';
const PASSWORD_ENC = encodeURIComponent(PASSWORD);

/** Resolves the test names to TARGET_IP for direct dials; everything else goes to the system resolver. */
const lookup: net.LookupFunction = (hostname, options, callback) => {
  if (!NAMES.includes(hostname)) return dns.lookup(hostname, options, callback as never);
  if ((options as dns.LookupAllOptions).all) (callback as never as (e: null, a: dns.LookupAddress[]) => void)(null, [{ address: TARGET_IP, family: 4 }]);
  else (callback as never as (e: null, a: string, f: number) => void)(null, TARGET_IP, 4);
};

let dir: string;
let hostsFile: string;
let pki: TestPki;
let squid: Squid;
let echo: TestServer;
const cleanups: Array<() => Promise<unknown>> = [];

async function squidWith(options: Parameters<typeof startSquid>[0] = {}): Promise<Squid> {
  const s = await startSquid({ ...options, extraConfig: [`hosts_file ${hostsFile}`, ...(options.extraConfig ?? [])] });
  cleanups.push(() => s.stop());
  return s;
}

function dialer(proxy: string | undefined, extra: Record<string, string> = {}, options: DialerOptions = {}): Dialer {
  const env: Record<string, string> = { ...extra };
  if (proxy) env.HTTPS_PROXY = proxy;
  return new Dialer({ env, lookup, connectTimeoutMs: 5_000, proxyAnswerTimeoutMs: 5_000, ...options });
}

/**
 * Writes msg and reads it back. Through squid the write side stays open until the echo is in: squid tears the
 * whole tunnel down when the client half-closes (it does not relay half-close), so halfClose is for direct dials.
 */
async function echoRoundTrip(socket: net.Socket, msg: string, halfClose = false): Promise<string> {
  const chunks: Buffer[] = [];
  let got = 0;
  const want = Buffer.byteLength(msg);
  const done = new Promise<void>((resolve, reject) => {
    socket.on('data', (c: Buffer) => {
      chunks.push(c);
      got += c.length;
      if (!halfClose && got >= want) resolve();
    });
    socket.once('end', resolve);
    socket.once('error', reject);
  });
  if (halfClose) socket.end(msg);
  else socket.write(msg);
  await done;
  socket.destroy();
  return Buffer.concat(chunks).toString();
}


/**
 * Dials each [target, NO_PROXY entry] with squid as HTTPS_PROXY and checks that it went direct: the plan says so,
 * the echo answers, and squid's log has no line for it. A marker dial through squid to markerTarget (which no other
 * test dials through this squid) comes last: once its line is there, anything from the direct dials would be too.
 */
async function expectDirect(cases: Array<[string, string]>, markerTarget: string): Promise<void> {
  const before = (await squid.readAccessLog()).length;
  for (const [target, noProxy] of cases) {
    const d = dialer(squid.url, { NO_PROXY: `other.example, ${noProxy}` });
    expect(d.plan(target).proxy, `${target} with NO_PROXY=${noProxy}`).toBeNull();
    const socket = await d.dial(target);
    expect(await echoRoundTrip(socket, `direct ${target}`)).toBe(`direct ${target}`);
  }
  const marker = await dialer(squid.url).dial(markerTarget);
  expect(await echoRoundTrip(marker, 'marker')).toBe('marker');
  await squid.waitForAccessLog((l) => l.includes(`CONNECT ${markerTarget} 200`));
  const lines = (await squid.readAccessLog()).slice(before);
  expect(lines).toHaveLength(1);
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-dial-'));
  await chmod(dir, 0o755);
  hostsFile = join(dir, 'hosts');
  await writeFile(hostsFile, `${TARGET_IP} ${NAMES.join(' ')}\n`, { mode: 0o644 });
  pki = await makeTestPki();
  cleanups.push(() => pki.cleanup());
  echo = await startEchoServer(TARGET_IP);
  squid = await squidWith();
});

afterAll(async () => {
  await Promise.allSettled(cleanups.map((c) => c()));
  await echo?.close();
  await rm(dir, { recursive: true, force: true });
});

describe('through squid', () => {
  it('CONNECTs through squid, and squid logs the tunnel', async () => {
    const socket = await dialer(squid.url).dial(`echo.gw.test:${echo.port}`);
    expect(await echoRoundTrip(socket, 'hello through squid')).toBe('hello through squid');
    const line = await squid.waitForAccessLog((l) => l.includes(`CONNECT echo.gw.test:${echo.port} 200`));
    expect(line).toContain('TCP_TUNNEL');
  });

  it('each kind of NO_PROXY name entry dials direct and squid logs nothing for it', async () => {
    await expectDirect([
      [`direct.gw.test:${echo.port}`, 'direct.gw.test'], // host
      [`a.svc.gw.test:${echo.port}`, '.gw.test'], // domain (subdomains)
      [`a.svc.gw.test:${echo.port}`, 'svc.gw.test'], // domain (itself and subdomains)
      [`port.gw.test:${echo.port}`, `port.gw.test:${echo.port}`], // host:port
    ], `marker.gw.test:${echo.port}`);
  });

  rootTest(['netns'])('NO_PROXY IP and CIDR entries dial a host that is not loopback direct, and squid logs nothing for them', async () => {
    const testHost = await createTestHost();
    try {
      await testHost.startEcho(7000);
      const target = `${testHost.ip}:7000`;
      await expectDirect([
        [target, '198.18.0.0/15'], // CIDR
        [target, testHost.ip], // IP
      ], target);
    } finally {
      await testHost.close();
    }
  });

  it('hands over the first bytes of a server that speaks first, byte-exact', async () => {
    const banner = pseudoRandomBytes(100_000, 7);
    const server = net.createServer((s) => s.end(banner));
    await new Promise<void>((r) => server.listen(0, TARGET_IP, r));
    try {
      const port = (server.address() as net.AddressInfo).port;
      const socket = await dialer(squid.url).dial(`echo.gw.test:${port}`);
      const chunks: Buffer[] = [];
      for await (const c of socket) chunks.push(c as Buffer);
      expect(Buffer.concat(chunks).equals(banner)).toBe(true);
    } finally {
      server.close();
    }
  });

  it('carries 256 MiB byte-exact (sha256 at both ends)', async () => {
    const sink: SinkServer = await startSinkServer(TARGET_IP);
    try {
      const socket = await dialer(squid.url).dial(`sink.gw.test:${sink.port}`);
      const hash = createHash('sha256');
      const chunk = pseudoRandomBytes(1 << 20, 42);
      let sent = 0;
      const total = 256 << 20;
      await new Promise<void>((resolve, reject) => {
        socket.once('error', reject);
        const pump = () => {
          while (sent < total) {
            // vary the bytes per MiB so a dropped or repeated chunk changes the digest
            const piece = Buffer.from(chunk);
            piece.writeUInt32BE(sent / (1 << 20), 0);
            hash.update(piece);
            sent += piece.length;
            if (!socket.write(piece)) {
              socket.once('drain', pump);
              return;
            }
          }
          socket.end(resolve);
        };
        pump();
      });
      const received = await sink.result(0);
      expect(received.bytes).toBe(total);
      expect(received.sha256).toBe(hash.digest('hex'));
      socket.destroy();
    } finally {
      await sink.close();
    }
  }, 180_000);

  it('sends HTTPS requests through squid with the same selection (DialerAgent)', async () => {
    const cert = await pki.serverCert({ names: ['web.gw.test'], ips: [] });
    const web = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => res.end(`hello ${req.url}`), TARGET_IP);
    try {
      const result = await fetchThroughDialer(`https://web.gw.test:${web.port}/webapi/find`, { dialer: dialer(squid.url), ca: pki.caPem });
      expect(result.status).toBe(200);
      expect(result.body.toString()).toBe('hello /webapi/find');
      await squid.waitForAccessLog((l) => l.includes(`CONNECT web.gw.test:${web.port} 200`));
    } finally {
      await web.close();
    }
  });
});

describe('squid with basic authentication', () => {
  let authSquid: Squid;
  beforeAll(async () => {
    authSquid = await squidWith({ auth: { user: 'alice', password: PASSWORD }, logAuthScheme: true });
  });

  it('the right password works, and squid logs the user', async () => {
    const url = authSquid.url.replace('http://', `http://alice:${PASSWORD_ENC}@`);
    const socket = await dialer(url).dial(`echo.gw.test:${echo.port}`);
    expect(await echoRoundTrip(socket, 'authenticated')).toBe('authenticated');
    await authSquid.waitForAccessLog((l) => l.includes(`CONNECT echo.gw.test:${echo.port} 200 alice`));
  });

  it('Basic is sent only after the 407 on the first dial, and with the first CONNECT of the next ones', async () => {
    const url = authSquid.url.replace('http://', `http://alice:${PASSWORD_ENC}@`);
    const before = (await authSquid.readAuthLog()).length;
    const d = dialer(url);
    for (const msg of ['first', 'second']) expect(await echoRoundTrip(await d.dial(`echo.gw.test:${echo.port}`), msg)).toBe(msg);
    const at = `CONNECT echo.gw.test:${echo.port}`;
    await authSquid.waitForAccessLog((l) => l.includes(`${at} 200 alice`));
    // Squid logs a tunnel when it closes: wait for both.
    await eventually('squid logged both tunnels', async () => {
      expect((await authSquid.readAuthLog()).slice(before).sort()).toEqual([`${at} 200 Basic`, `${at} 200 Basic`, `${at} 407 -`]);
    }, 10_000);
  });

  it('a wrong password is refused with the auth error, and no password is shown', async () => {
    const url = authSquid.url.replace('http://', `http://alice:${PASSWORD_ENC}-wrong@`);
    const err = await dialError(dialer(url), `echo.gw.test:${echo.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
    expect(err.details.status).toBe(407);
    expect(err.message).toContain('alice:***@');
  });

  it('no credentials gives "authentication required"', async () => {
    const err = await dialError(dialer(authSquid.url), `echo.gw.test:${echo.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REQUIRED');
  });
});

describe('squid with digest authentication (digest_file_auth), and offering digest and basic', () => {
  let digest: Squid;
  let both: Squid;
  const withCredentials = (s: Squid, password = PASSWORD_ENC) => s.url.replace('http://', `http://alice:${password}@`);
  beforeAll(async () => {
    [digest, both] = await Promise.all([
      squidWith({ auth: { user: 'alice', password: PASSWORD, schemes: ['digest'] }, logAuthScheme: true }),
      // Basic first: the order of the headers must not matter.
      squidWith({ auth: { user: 'alice', password: PASSWORD, schemes: ['basic', 'digest'] }, logAuthScheme: true }),
    ]);
  });

  it('curl --proxy-anyauth and --proxy-digest get through both (the lab works before the gateway is judged by it)', async () => {
    for (const s of [digest, both]) {
      for (const flag of ['--proxy-anyauth', '--proxy-digest']) {
        const before = (await s.readAuthLog()).length;
        // The echo is no TLS server: curl's TLS fails after the tunnel is up; %{http_connect} is the CONNECT's status.
        const r = await curl([flag, '-x', s.url, '-U', `alice:${PASSWORD}`, '-o', '/dev/null', '-w', '%{http_connect}', '--max-time', '10', `https://echo.gw.test:${echo.port}/`]);
        expect(r.stdout, `${flag}: ${r.stderr}`).toBe('200');
        await eventually('squid logged the tunnel', async () => {
          expect((await s.readAuthLog()).slice(before)).toContain(`CONNECT echo.gw.test:${echo.port} 200 Digest`);
        }, 10_000);
      }
    }
  });

  it('the Dialer answers the digest squid with Digest; squid logs the user', async () => {
    const socket = await dialer(withCredentials(digest)).dial(`echo.gw.test:${echo.port}`);
    expect(await echoRoundTrip(socket, 'digest')).toBe('digest');
    await digest.waitForAccessLog((l) => l.includes(`CONNECT echo.gw.test:${echo.port} 200 alice`));
    const lines = (await digest.readAuthLog()).slice(-2);
    expect(lines).toEqual([`CONNECT echo.gw.test:${echo.port} 407 -`, `CONNECT echo.gw.test:${echo.port} 200 Digest`]);
  });

  it('squid offering Basic and Digest gets Digest, and never Basic', async () => {
    const before = (await both.readAuthLog()).length;
    const d = dialer(withCredentials(both));
    for (let i = 0; i < 2; i++) expect(await echoRoundTrip(await d.dial(`echo.gw.test:${echo.port}`), `both ${i}`)).toBe(`both ${i}`);
    await both.waitForAccessLog((l) => l.includes(`CONNECT echo.gw.test:${echo.port} 200 alice`));
    // squid writes each CONNECT's lines when its tunnel closes: wait (bounded) for the second one too
    let mine: string[] = [];
    for (let tries = 0; tries < 100; tries++) {
      mine = (await both.readAuthLog()).slice(before);
      if (mine.filter((l) => l.endsWith(' 200 Digest')).length >= 2) break;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    expect(mine.filter((l) => l.endsWith(' 200 Digest'))).toHaveLength(2);
    expect(mine.filter((l) => / Basic$/.test(l))).toEqual([]);
  });

  it('a wrong password: GW_ERR_DIAL_PROXY_AUTH_REFUSED naming Digest, the password nowhere', async () => {
    const err = await dialError(dialer(withCredentials(digest, `${PASSWORD_ENC}-wrong`)), `echo.gw.test:${echo.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
    expect(err.message).toContain('refused the Digest credentials of user "alice"');
    expect(JSON.stringify(err)).not.toContain(PASSWORD);
  });
});

describe('squid that allows CONNECT only to 443', () => {
  it('gives the policy error for the reverse tunnel port 3024, with the TLS-routing hint', async () => {
    const strict = await squidWith({ connectPorts: [443] });
    const err = await dialError(dialer(strict.url), 'proxy.gw.test:3024');
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_REFUSED');
    expect(err.details.status).toBe(403);
    expect(err.hint).toMatch(/443/);
    expect(err.hint).toMatch(/TLS routing/);
  });
});

describe('squid that cannot reach the target (nothing listens there)', () => {
  it('GW_ERR_DIAL_PROXY_TARGET_UNREACHABLE names the target, not the access rules; once the target is up, the same dial goes through', async () => {
    const spare = net.createServer();
    await new Promise<void>((resolve) => spare.listen(0, TARGET_IP, resolve));
    const port = (spare.address() as net.AddressInfo).port;
    await new Promise((resolve) => spare.close(resolve)); // nothing listens there any more
    const err = await dialError(dialer(squid.url), `echo.gw.test:${port}`);
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_TARGET_UNREACHABLE');
    expect([502, 503, 504]).toContain(err.details.status);
    expect(err.message).toContain(`could not reach echo.gw.test:${port}`);
    expect(err.hint).toContain(`check that echo.gw.test:${port} is up and listening`);
    expect(err.hint).not.toMatch(/access rules/);
    // What the hint asks for: the target is started where it should be; the dial, unchanged, now reaches it.
    const revived = net.createServer((c) => c.pipe(c));
    await new Promise<void>((resolve) => revived.listen(port, TARGET_IP, resolve));
    try {
      const socket = await eventually('the revived target through squid', () => dialer(squid.url).dial(`echo.gw.test:${port}`));
      try {
        expect(await echoRoundTrip(socket, 'back up')).toBe('back up');
      } finally {
        socket.destroy();
      }
    } finally {
      await new Promise((resolve) => revived.close(resolve));
    }
  });
});

describe('https:// proxy', () => {
  let tlsSquid: Squid;
  beforeAll(async () => {
    const cert = await pki.serverCert({ names: ['squid.gw.test'], ips: ['127.0.0.2'] });
    tlsSquid = await squidWith({ tls: { cert: cert.certPath, key: cert.keyPath } });
  });

  it('tunnels inside TLS to the proxy, verified with the extra CA', async () => {
    const socket = await dialer(tlsSquid.httpsUrl!, {}, { proxyCa: pki.caPem }).dial(`echo.gw.test:${echo.port}`);
    expect(socket.constructor.name).toBe('TLSSocket');
    socket.write('over tls');
    const got = await new Promise<string>((resolve) => socket.once('data', (c: Buffer) => resolve(c.toString())));
    expect(got).toBe('over tls');
    socket.destroy();
    await tlsSquid.waitForAccessLog((l) => l.includes(`CONNECT echo.gw.test:${echo.port} 200`));
  });

  it('answers Digest inside the TLS to the proxy', async () => {
    const cert = await pki.serverCert({ names: ['squid.gw.test'], ips: ['127.0.0.2'] });
    const s = await squidWith({ tls: { cert: cert.certPath, key: cert.keyPath }, auth: { user: 'alice', password: PASSWORD, schemes: ['digest'] } });
    const url = s.httpsUrl!.replace('https://', `https://alice:${PASSWORD_ENC}@`);
    const socket = await dialer(url, {}, { proxyCa: pki.caPem }).dial(`echo.gw.test:${echo.port}`);
    expect(await echoRoundTrip(socket, 'digest over tls')).toBe('digest over tls');
    await s.waitForAccessLog((l) => l.includes(`CONNECT echo.gw.test:${echo.port} 200 alice`));
  });

  it("refuses a proxy whose certificate it cannot verify", async () => {
    const err = await dialError(dialer(tlsSquid.httpsUrl!), `echo.gw.test:${echo.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_TLS');
  });
});

describe('proxies that fail', () => {
  async function misbehaving(onConnection: (s: net.Socket) => void): Promise<{ url: string; close: () => void }> {
    const server = net.createServer(onConnection);
    await new Promise<void>((r) => server.listen(0, '127.0.0.2', r));
    const port = (server.address() as net.AddressInfo).port;
    return { url: `http://127.0.0.2:${port}`, close: () => server.close() };
  }

  it('proxy down: unreachable, naming the proxy and the variable', async () => {
    const free = await misbehaving(() => undefined);
    free.close();
    const err = await dialError(dialer(free.url), 'proxy.gw.test:443');
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_UNREACHABLE');
    expect(err.message).toContain(free.url);
    expect(err.message).toContain('HTTPS_PROXY');
  });

  it('proxy that never answers: no answer within the configured time', async () => {
    const silent = await misbehaving(() => undefined);
    try {
      const err = await dialError(dialer(silent.url, {}, { proxyAnswerTimeoutMs: 300 }), 'proxy.gw.test:443');
      expect(err.code).toBe('GW_ERR_DIAL_PROXY_NO_ANSWER');
    } finally {
      silent.close();
    }
  });

  it('https proxy that never finishes the handshake: connect timeout', async () => {
    const silent = await misbehaving(() => undefined);
    try {
      const url = silent.url.replace('http://', 'https://');
      const err = await dialError(dialer(url, {}, { connectTimeoutMs: 300 }), 'proxy.gw.test:443');
      expect(err.code).toBe('GW_ERR_DIAL_CONNECT_TIMEOUT');
    } finally {
      silent.close();
    }
  });

  it('proxy that closes early', async () => {
    const closer = await misbehaving((s) => s.once('data', () => s.end('HTTP/1.1 200')));
    try {
      expect((await dialError(dialer(closer.url), 'proxy.gw.test:443')).code).toBe('GW_ERR_DIAL_PROXY_CLOSED');
    } finally {
      closer.close();
    }
  });

  it('proxy that is not HTTP: malformed answer', async () => {
    const ssh = await misbehaving((s) => s.write('SSH-2.0-OpenSSH_9.2\r\n'));
    try {
      expect((await dialError(dialer(ssh.url), 'proxy.gw.test:443')).code).toBe('GW_ERR_DIAL_PROXY_MALFORMED');
    } finally {
      ssh.close();
    }
  });

  it('keeps tunnel bytes sent in the same packet as the 200', async () => {
    const eager = await misbehaving((s) => s.once('data', () => s.write('HTTP/1.1 200 OK\r\n\r\nSSH-2.0-banner\r\n')));
    try {
      const socket = await dialer(eager.url).dial('proxy.gw.test:443');
      const got = await new Promise<string>((resolve) => socket.once('data', (c: Buffer) => resolve(c.toString())));
      expect(got).toBe('SSH-2.0-banner\r\n');
      socket.destroy();
    } finally {
      eager.close();
    }
  });

  it('passes half-close through a direct dial', async () => {
    const socket = await dialer(undefined).dial(`direct.gw.test:${echo.port}`);
    expect(await echoRoundTrip(socket, 'half', true)).toBe('half');
  });
});

describe('secrets', () => {
  it('no password appears in any log line or error message', async () => {
    const errors: GatewayError[] = [];
    const tries: Array<[string, Record<string, string>]> = [
      [`http://alice:${PASSWORD_ENC}@127.0.0.2:1`, {}], // proxy down
      [`socks4://alice:${PASSWORD_ENC}@squid:1080`, {}], // bad scheme
      [`socks5h://alice:${PASSWORD_ENC}@127.0.0.2:1`, {}], // SOCKS proxy down
      [`http://alice:${PASSWORD_ENC}@localhost:3128`, {}], // loopback proxy
      [`alice:${PASSWORD_ENC}@127.0.0.2:99999`, {}], // bad port
    ];
    for (const [proxy, extra] of tries) {
      try {
        const s = await dialer(proxy, extra).dial('proxy.gw.test:443');
        s.destroy();
      } catch (err) {
        errors.push(err as GatewayError);
      }
    }
    expect(errors).toHaveLength(tries.length);
    const texts = [...errors.flatMap((e) => [e.message, e.hint, JSON.stringify(e), JSON.stringify(e.details)]), ...logLines];
    expect(logLines.length).toBeGreaterThan(0);
    for (const text of texts) {
      expect(text).not.toContain(PASSWORD);
      expect(text).not.toContain(PASSWORD_ENC);
      expect(text).not.toContain(Buffer.from(`alice:${PASSWORD}`).toString('base64'));
    }
  });
});
