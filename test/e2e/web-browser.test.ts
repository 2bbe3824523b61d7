/**
 * The Web UI in a real browser: Debian's Chromium driven by playwright-core (test/helpers/browser.ts), against a
 * real daemon (auth + proxy, TLS routing on one port) and a real agent (ssh_service) joined through the Proxy.
 *
 * The browser trusts the cluster's host CA through an NSS database of its own (never ignoreHTTPSErrors) and
 * reaches the Proxy by the name `proxy.gateway.test` (host resolver rules), as a user's browser reaches it by DNS.
 * Screenshots of each step: test-results/web/web-browser/.
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:https';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { launchBrowser, type TestBrowser } from '../helpers/browser.js';
import { startGateway, type RunningGateway } from '../helpers/gateway.js';
import { makeTestPki } from '../helpers/tls.js';

const PROXY_NAME = 'proxy.gateway.test';
const LOGIN = userInfo().username;
let dir: string;
let cluster: RunningGateway;
let browser: TestBrowser;
let origin: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-web-'));
  const port = await getPort({ host: '127.0.0.1' });
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'auth_service:',
      '  cluster_name: web.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: 127.0.0.1:${port}`,
      `  public_addr: ${PROXY_NAME}:${port}`,
      '',
    ].join('\n'),
  );
  origin = `https://${PROXY_NAME}:${port}`;
  const ca = await readFile(join(cluster.dataDir, 'admin', 'host-ca.pem'), 'utf8');
  browser = await launchBrowser({ suite: 'web-browser', trust: [ca] });
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await cluster?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('the browser harness', () => {
  it("loads /webapi/ping over TLS the browser checks against the cluster's CA (no certificate error ignored)", async () => {
    const { page } = browser;
    const res = await browser.step(page, 'ping', () => page.goto(`${origin}/webapi/ping`));
    expect(res?.status()).toBe(200);
    const ping = JSON.parse((await page.textContent('body')) ?? '') as { cluster_name: string; auth: { type: string } };
    expect(ping.cluster_name).toBe('web.example');
    expect(ping.auth.type).toBe('local');
    expect(LOGIN).not.toBe('');
  });

  it('refuses a server whose certificate another CA issued, and a name the Proxy certificate does not hold', async () => {
    const { page } = browser;
    // A real HTTPS server with a certificate from a CA the browser does not trust.
    const pki = await makeTestPki();
    const cert = await pki.serverCert({ names: ['other.gateway.test'], ips: [] });
    const port = await getPort({ host: '127.0.0.1' });
    const server: Server = createServer({ cert: cert.certPem, key: cert.keyPem }, (_req, res) => res.end('must not be shown'));
    await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
    try {
      await expect(page.goto(`https://other.gateway.test:${port}/`)).rejects.toThrow(/ERR_CERT_AUTHORITY_INVALID/);
    } finally {
      await new Promise((resolve) => server.close(resolve));
      await pki.cleanup();
    }
    // The Proxy's own port under a name its certificate does not hold.
    const wrong = origin.replace(PROXY_NAME, 'not-the-proxy.gateway.test');
    await expect(page.goto(`${wrong}/webapi/ping`)).rejects.toThrow(/ERR_CERT_COMMON_NAME_INVALID/);
  });
});

