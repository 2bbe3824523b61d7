/**
 * A WebSocket through an HTTP app from a real browser (Debian's Chromium, test/helpers/browser.ts): the user signs
 * in to the Web UI, opens the app from the resources page (its own host name, its own app session cookie), and the
 * app's page opens a WebSocket to its own host (src/proxy/appupgrade.ts), as a real app's page does. The app is the
 * `ws` server behind a real agent; it echoes. A page of another browser context, without the app session, is
 * refused before the app is asked. Chromium cancels a WebSocket whose TLS handshake brings a client-certificate
 * request for a name it never decided about, which is what happened while it pooled the app's HTTP/2 requests on
 * the Proxy's connection: the Proxy's 421 for them (webapps.ts misdirected) is what makes this test pass over
 * HTTP/2. The CLI side and the hostile cases are test/e2e/app-upgrades.test.ts.
 * Screenshots: test-results/web/app-upgrades-browser/. Waits are for selectors and promises; no timing asserted.
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocketServer } from 'ws';
import { launchBrowser, type TestBrowser } from '../helpers/browser.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';

const PROXY_NAME = 'proxy.gateway.test';
const APP_NAME = `chat.${PROXY_NAME}`;
const PASSWORD = 'correct horse battery';
let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let app: Server;
let upgrades = 0;
let browser: TestBrowser;
let origin: string;

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-appws-browser-'));
  const port = await getPort({ host: '127.0.0.1' });
  cluster = await startGateway(
    ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: chat.example', '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${port}`, `  public_addr: [127.0.0.1:${port}, ${PROXY_NAME}:${port}]`, ''].join('\n'),
  );
  origin = `https://${PROXY_NAME}:${port}`;
  const wss = new WebSocketServer({ noServer: true, maxPayload: 16 * 1024 * 1024 });
  app = createServer((_req, res) => {
    res.setHeader('content-type', 'text/html; charset=utf-8');
    res.end('<!doctype html><title>Chat (test)</title><h1 data-testid="app-page">chat app</h1>');
  });
  app.on('upgrade', (req, socket, head) => {
    upgrades += 1;
    wss.handleUpgrade(req, socket, head, (ws) => ws.on('message', (data: Buffer, binary: boolean) => ws.send(data, { binary })));
  });
  await new Promise<void>((r) => app.listen(0, '127.0.0.1', r));
  const appPort = (app.address() as AddressInfo).port;
  expect((await gwctl(['users', 'add', 'alice', '--roles=access'], `${PASSWORD}\n`)).status).toBe(0);
  const pin = /CA pin:\s+(\S+)/.exec((await gwctl(['status'])).stdout)![1]!;
  const token = (JSON.parse((await gwctl(['tokens', 'add', '--type=app', '--format', 'json'])).stdout) as { token: string }).token;
  agent = await startGateway(
    ['gateway:', '  nodename: agent-chat', '  data_dir: DATA_DIR', '  log: { format: json }', 'app_service:', '  apps:', `    - { name: chat, uri: "http://127.0.0.1:${appPort}", public_addr: ${APP_NAME} }`, ''].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', `127.0.0.1:${port}`] },
  );
  await agent.waitForLog('reverse tunnel ready', 30_000);
  browser = await launchBrowser({ suite: 'app-upgrades-browser', trust: [await readFile(join(cluster.dataDir, 'admin', 'host-ca.pem'), 'utf8')] });
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await agent?.stop();
  await cluster?.stop();
  await new Promise((r) => (app ? app.close(r) : r(undefined)));
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** Runs in the page (page.evaluate: no closure): a WebSocket to its own host at /echo; sends `size` bytes and says whether the echo was the same. */
function echoInPage(size: number): Promise<string> {
  return new Promise<string>((resolve) => {
    const ws = new WebSocket(`wss://${location.host}/echo`);
    ws.binaryType = 'arraybuffer';
    const sent = new Uint8Array(size);
    for (let i = 0; i < size; i += 65536) crypto.getRandomValues(sent.subarray(i, Math.min(size, i + 65536)));
    ws.onopen = () => ws.send(sent);
    ws.onmessage = (e: MessageEvent<ArrayBuffer>) => {
      const got = new Uint8Array(e.data);
      const same = got.length === sent.length && got.every((b, i) => b === sent[i]);
      ws.close();
      resolve(same ? `echoed ${got.length}` : `differs: ${got.length} bytes`);
    };
    ws.onclose = (e) => resolve(`closed ${e.code}`);
  });
}

describe('a WebSocket from an app page in Chromium', () => {
  it('the app opened from the Web UI echoes 4 MiB over its own WebSocket, byte-exact', async () => {
    const { page } = browser;
    await browser.step(page, 'app-opened', async () => {
      await page.goto(`${origin}/web/login`);
      await page.getByTestId('login-user').fill('alice');
      await page.getByTestId('login-password').fill(PASSWORD);
      await page.getByTestId('login-submit').click();
      await page.getByTestId('resource-tab-apps').click();
      await page.getByTestId('app-open-chat').click();
      await page.getByTestId('app-page').waitFor();
    });
    expect(new URL(page.url()).hostname).toBe(APP_NAME);
    expect(await page.evaluate(echoInPage, 4 * 1024 * 1024)).toBe(`echoed ${4 * 1024 * 1024}`);
    expect(browser.log(page).errors).toEqual([]);
  });

  it('hostile: a page of another browser context (no app session) is refused before the app is asked', async () => {
    const { context, page } = await browser.newPage();
    // The app's host answers its refusal page; the WebSocket from it must not reach the app.
    await page.goto(`https://${APP_NAME}:${new URL(origin).port}/`);
    const before = upgrades;
    expect(await page.evaluate(echoInPage, 16)).toBe('closed 1006');
    expect(upgrades).toBe(before);
    await context.close();
  });
});
