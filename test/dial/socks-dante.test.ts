/**
 * The Dialer through a real SOCKS5 server: Debian's Dante (danted), in a test host's network namespace
 * (test/helpers/netns.ts) with a hosts file of its own, so that echo.socks.test is a name only the SOCKS server
 * can resolve. The targets listen in this namespace on the link's address, which is not loopback (loopback
 * targets are never proxied). Each case is first done with curl, the reference client, so that a failure is the
 * gateway's and not the lab's. One danted without authentication, one with username/password (a throw-away
 * system account: dante checks the system's password database). HTTPS requests (DialerAgent) and the
 * upgrader's release download take the same path.
 */
import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import net from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { fetchThroughDialer } from '../../src/dial/agent.js';
import { Dialer, type DialerOptions } from '../../src/dial/dialer.js';
import { download } from '../../src/upgrade/download.js';
import { curl } from '../helpers/curl.js';
import { createSocksUser, startDante, type Dante, type SocksUser } from '../helpers/dante.js';
import { createTestHost, type TestHost } from '../helpers/netns.js';
import { rootSuite } from '../helpers/root.js';
import { pseudoRandomBytes, startEchoServer, startHttpsServer, startHttpServer, type EchoServer, type HttpTestServer } from '../helpers/servers.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { dialError } from '../helpers/dial.js';

const describeAsRoot = rootSuite(['netns', 'users']);
const NAME = 'echo.socks.test';

let testHost: TestHost;
let open: Dante;
let authed: Dante;
let user: SocksUser;
let echo: EchoServer;
let web: HttpTestServer;
let pki: TestPki;

function dialer(url: string, options: DialerOptions = {}): Dialer {
  return new Dialer({ env: { HTTPS_PROXY: url }, connectTimeoutMs: 5_000, proxyAnswerTimeoutMs: 5_000, ...options });
}


/** 1 MiB there and back through the tunnel, compared by sha256. */
async function echoExact(socket: net.Socket): Promise<void> {
  const data = pseudoRandomBytes(1 << 20, 3);
  const got = createHash('sha256');
  let n = 0;
  await new Promise<void>((resolve, reject) => {
    socket.on('data', (c: Buffer) => {
      got.update(c);
      n += c.length;
      if (n >= data.length) resolve();
    });
    socket.once('error', reject);
    socket.write(data);
  });
  socket.destroy();
  expect(got.digest('hex')).toBe(createHash('sha256').update(data).digest('hex'));
}

describeAsRoot('through Dante (SOCKS5)', () => {
  beforeAll(async () => {
    testHost = await createTestHost();
    echo = await startEchoServer(testHost.localIp);
    web = await startHttpServer((_req, res) => res.end('hello through dante'), testHost.localIp);
    pki = await makeTestPki();
    user = createSocksUser();
    const hosts = `${testHost.localIp} ${NAME}`;
    open = await startDante({ ns: testHost.ns, internal: testHost.ip, port: 1080, hosts });
    authed = await startDante({ ns: testHost.ns, internal: testHost.ip, port: 1081, hosts, auth: true });
  }, 60_000);

  afterAll(async () => {
    await Promise.allSettled([open?.stop(), authed?.stop(), echo?.close(), web?.close(), pki?.cleanup()]);
    user?.remove();
    await testHost?.close();
  });

  it('curl, the reference client, gets through both (socks5h: the name is resolved by danted)', async () => {
    const r1 = await curl(['--proxy', open.url('socks5h'), `http://${NAME}:${web.port}/`]);
    expect(r1.stdout).toBe('hello through dante');
    const r2 = await curl(['--proxy', authed.url('socks5h', user), `http://${NAME}:${web.port}/`]);
    expect(r2.stdout).toBe('hello through dante');
    await authed.waitForLog((l) => l.includes(`username%${user.user}@`));
  });

  it('socks5h://: a name only danted knows, byte-exact; danted logs the session', async () => {
    await echoExact(await dialer(open.url('socks5h')).dial(`${NAME}:${echo.port}`));
    await open.waitForLog((l) => l.includes('tcp/connect [') && l.includes(`${testHost.localIp}.${echo.port}`));
  });

  it('socks5://: the name resolved here, the address sent', async () => {
    const lookup: net.LookupFunction = (_h, _o, cb) => (cb as unknown as (e: null, a: string, f: number) => void)(null, testHost.localIp, 4);
    await echoExact(await dialer(open.url('socks5'), { lookup }).dial(`${NAME}:${echo.port}`));
  });

  it('username/password: the right one works and danted logs the user', async () => {
    await echoExact(await dialer(authed.url('socks5h', user)).dial(`${NAME}:${echo.port}`));
    await authed.waitForLog((l) => l.includes('tcp/connect [') && l.includes(`username%${user.user}@`) && l.includes(`.${echo.port}`));
  });

  it('a wrong password is refused, naming the user and never the password', async () => {
    const wrong = { ...user, password: `${user.password}-wrong` };
    const err = await dialError(dialer(authed.url('socks5h', wrong)), `${NAME}:${echo.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_SOCKS_AUTH_REFUSED');
    expect(err.message).toContain(user.user);
    expect(err.message).not.toContain(wrong.password);
    expect(err.message).not.toContain(encodeURIComponent(wrong.password));
  });

  it('no credentials where danted wants them: authentication required', async () => {
    expect((await dialError(dialer(authed.url('socks5h')), `${NAME}:${echo.port}`)).code).toBe('GW_ERR_DIAL_SOCKS_AUTH_REQUIRED');
  });

  it('a target nothing listens on: danted refuses with its reply code, named', async () => {
    const closed = await startEchoServer(testHost.localIp);
    await closed.close();
    const err = await dialError(dialer(open.url('socks5h')), `${NAME}:${closed.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_SOCKS_REFUSED');
    // danted answers "connection refused" (reply 5), and the hint points at the target, not at the SOCKS server
    expect(err.details.reply).toBe(5);
    expect(err.message).toContain('connection refused');
    expect(err.hint).toMatch(/cannot reach the target/);
  });

  it('ALL_PROXY alone is used, and HTTPS requests go the same way (DialerAgent)', async () => {
    const cert = await pki.serverCert({ names: [NAME], ips: [] });
    const https = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => res.end(`tls ${req.url}`), testHost.localIp);
    try {
      const d = new Dialer({ env: { ALL_PROXY: open.url('socks5h', undefined) }, connectTimeoutMs: 5_000, proxyAnswerTimeoutMs: 5_000 });
      expect(d.plan(`https://${NAME}:${https.port}/`).source).toBe('ALL_PROXY');
      const result = await fetchThroughDialer(`https://${NAME}:${https.port}/x`, { dialer: d, ca: pki.caPem });
      expect(result.body.toString()).toBe('tls /x');
    } finally {
      await https.close();
    }
  });

  it("the upgrader's release download goes through danted too, byte-exact", async () => {
    const release = pseudoRandomBytes(8 << 20, 11);
    const cert = await pki.serverCert({ names: [NAME], ips: [] });
    const cdn = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (_req, res) => res.end(release), testHost.localIp);
    const dir = await mkdtemp(join(tmpdir(), 'gw-socks-dl-'));
    try {
      const d = new Dialer({ env: { HTTPS_PROXY: authed.url('socks5h', user) }, connectTimeoutMs: 5_000, proxyAnswerTimeoutMs: 5_000 });
      const got = await download(`https://${NAME}:${cdn.port}/gateway-v17.0.1-linux-amd64.tar.gz`, join(dir, 'release.tar.gz'), { dialer: d, ca: [pki.caPem] });
      const want = createHash('sha256').update(release).digest('hex');
      expect(got.sha256).toBe(want);
      expect(createHash('sha256').update(await readFile(join(dir, 'release.tar.gz'))).digest('hex')).toBe(want);
      await authed.waitForLog((l) => l.includes('tcp/connect [') && l.includes(`username%${user.user}@`) && l.includes(`.${cdn.port}`));
    } finally {
      await cdn.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
