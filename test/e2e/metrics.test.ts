/**
 * The metrics as an operator scrapes them: a real daemon set (a Proxy + Auth Service, and an agent that reaches
 * the Proxy only through squid), each with its diagnostics listener, scraped by Debian's Prometheus (its own
 * configuration and storage in a temp dir). Its query API must show the tunnel and dial series with the values the
 * set-up implies; `promtool check metrics` must pass on each /metrics body; every series of each body must be
 * declared with bounded labels (a new metric with an unbounded label fails here); and the public port must not
 * serve /metrics. With METRICS_SCREENSHOT=<file.png>, Prometheus's graph page of the tunnel and dial series is
 * saved there by Debian's Chromium (docs/images/prometheus-graph.png was made so: docs/operations.md says how).
 */
import { chmod, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { launchBrowser } from '../helpers/browser.js';
import { curl } from '../helpers/curl.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { labelBoundViolations, parseExposition, sampleValue } from '../helpers/metrics.js';
import { promtoolCheckMetrics, startPrometheus, type Prometheus } from '../helpers/prometheus.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { waitUntil } from '../helpers/wait.js';

const PROXY_IP = '127.0.0.3';
const PROXY_NAME = 'proxy.gw.test';

let dir: string;
let squid: Squid;
let cluster: RunningGateway;
let agent: RunningGateway;
let prometheus: Prometheus;
let webPort: number;
const diag = { cluster: '', agent: '' };

async function metricsBody(at: string): Promise<string> {
  const r = await curl([`http://${at}/metrics`]);
  expect(r.status).toBe(0);
  return r.stdout;
}

/** The one value of an instant query (undefined while Prometheus has no such series yet). */
async function scalar(expr: string): Promise<number | undefined> {
  const result = await prometheus.query(expr);
  return result.length === 1 ? Number(result[0]!.value[1]) : undefined;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-metrics-'));
  await chmod(dir, 0o755); // squid (its own user) reads the hosts file in it
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  webPort = await getPort({ host: PROXY_IP });
  const [clusterDiag, agentDiag] = [await getPort({ host: '127.0.0.1' }), await getPort({ host: '127.0.0.1' })];
  cluster = await startGateway(
    ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', `  diag_addr: 127.0.0.1:${clusterDiag}`, '  log: { format: json }', 'auth_service:', '  cluster_name: metrics.example', '  listen_addr: 127.0.0.1:0', '  keep_alive_interval: 1s', 'proxy_service:', `  web_listen_addr: ${PROXY_IP}:${webPort}`, `  public_addr: ${PROXY_NAME}:${webPort}`, ''].join('\n'),
  );
  diag.cluster = cluster.addresses.diag!;
  const admin = (args: string[]) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir } });
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string }).token;
  // The agent's upgrader is enrolled (its directory exists) and its last run failed: the agent's metrics say so.
  const upgradeRoot = join(dir, 'root');
  await mkdir(join(upgradeRoot, 'etc', 'gateway-upgrade.d'), { recursive: true });
  await writeFile(
    join(upgradeRoot, 'etc', 'gateway-upgrade.d', 'last-run'),
    `${JSON.stringify({ version: 'v1', at: 1767578400, result: 'failed', code: 'GW_ERR_UPGRADE_HEALTH', current: '17.0.0', target: '17.1.0' })}\n`,
  );
  agent = await startGateway(['gateway:', '  nodename: node-1', '  data_dir: DATA_DIR', `  diag_addr: 127.0.0.1:${agentDiag}`, '  log: { format: json }', 'ssh_service:', '  enabled: yes', ''].join('\n'), {
    args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${webPort}`],
    // Its only way to the Proxy is squid (only squid's hosts file knows the Proxy's name).
    env: { HTTPS_PROXY: squid.url, GATEWAY_UPGRADE_ROOT: upgradeRoot },
  });
  diag.agent = agent.addresses.diag!;
  await agent.waitForLog('reverse tunnel ready');
  prometheus = await startPrometheus({ cluster: [diag.cluster], agent: [diag.agent] });
}, 120_000);

afterAll(async () => {
  await prometheus?.stop();
  await agent?.stop();
  await cluster?.stop();
  await squid?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('Prometheus scrapes the Proxy + Auth Service and the agent', () => {
  it('its query API shows the tunnel and dial series with the expected values', async () => {
    await waitUntil('both targets up', async () => (await scalar('sum(up{job=~"cluster|agent"})')) === 2, 30_000, 250);
    // The Proxy holds one agent on tunnel protocol v2; the agent holds one tunnel, on the ALPN rung (through squid).
    await waitUntil('the tunnel series', async () => (await scalar('gateway_tunnel_agents_connected{job="cluster",protocol="v2"}')) === 1, 30_000, 250);
    expect(await scalar('gateway_tunnel_agents_connected{job="cluster",protocol="v1"}')).toBe(0);
    expect(await scalar('gateway_agent_tunnels_up{job="agent",transport="alpn"}')).toBe(1);
    // The agent's dials went through squid (http://, no proxy authentication) and succeeded, each timed.
    expect(await scalar('sum(gateway_dials_total{job="agent",scheme="http",outcome="ok",auth="none"})')).toBeGreaterThanOrEqual(1);
    expect(await scalar('sum(gateway_dials_total{job="agent",scheme="direct"})')).toBeUndefined();
    expect(await scalar('gateway_dial_duration_seconds_count{job="agent",scheme="http",result="ok"}')).toBeGreaterThanOrEqual(1);
    // The Proxy's one port accepted the agent's connections and routed them.
    expect(await scalar('gateway_connections_accepted_total{job="cluster",listener="web"}')).toBeGreaterThanOrEqual(1);
    expect(await scalar('gateway_connection_bytes_total{job="cluster",listener="web",direction="received"}')).toBeGreaterThan(0);
    // Certificates: the cluster's CAs and the agent's host certificate expire in the future.
    expect(await scalar('gateway_certificate_expiry_timestamp_seconds{job="cluster",role="host_ca"} > time()')).toBeGreaterThan(0);
    expect(await scalar('gateway_certificate_expiry_timestamp_seconds{job="agent",role="agent_host"} > time()')).toBeGreaterThan(0);
    // The upgrader's last run, read by the agent from its directory.
    expect(await scalar('gateway_agent_upgrade_last_result{job="agent",result="failed"}')).toBe(1);
    expect((await prometheus.query('gateway_agent_upgrade_info{job="agent"}'))[0]?.metric).toMatchObject({ target: '17.1.0' });
    // The backend answers (the Auth Service's operations are timed).
    expect(await scalar('sum(gateway_backend_operation_duration_seconds_count{job="cluster",backend="sqlite"})')).toBeGreaterThan(0);
  }, 90_000);

  it('promtool check metrics passes on each /metrics body', async () => {
    for (const at of [diag.cluster, diag.agent]) {
      const check = promtoolCheckMetrics(await metricsBody(at));
      expect(check, check.output).toMatchObject({ status: 0 });
    }
  });

  it('every series is declared and every label value is in its declared set (no user name, no address)', async () => {
    for (const at of [diag.cluster, diag.agent]) {
      const samples = parseExposition(await metricsBody(at));
      expect(samples.length).toBeGreaterThan(50);
      expect(labelBoundViolations(samples)).toEqual([]);
      expect(sampleValue(samples, 'gateway_process_cpu_seconds_total')).toBeGreaterThan(0);
    }
  });

  // Only with METRICS_SCREENSHOT=<file.png>: it makes the image of docs/operations.md, it checks nothing more.
  it.skipIf(!process.env.METRICS_SCREENSHOT)("a screenshot of Prometheus's graph page with the tunnel and dial series (METRICS_SCREENSHOT)", async () => {
    const browser = await launchBrowser({ suite: 'metrics', viewport: { width: 1280, height: 2360 } });
    try {
      // A few more scrapes, so that the graphs have a line to draw.
      await new Promise((resolve) => setTimeout(resolve, 15_000));
      const exprs = ['gateway_tunnel_agents_connected', 'gateway_agent_tunnels_up', 'gateway_dials_total{job="agent"}'];
      const query = exprs.map((e, i) => `g${i}.expr=${encodeURIComponent(e)}&g${i}.tab=0&g${i}.range_input=1m`).join('&');
      await browser.page.goto(`${prometheus.url}/graph?${query}`);
      await browser.page.waitForLoadState('networkidle');
      // The legend of the last graph shows once its data has come and is drawn.
      await browser.page.waitForFunction(() => document.body.innerText.includes('outcome="ok"'), undefined, { timeout: 30_000 });
      await browser.page.evaluate(() => {
        (document.activeElement as HTMLElement | null)?.blur();
        window.scrollTo(0, 0);
      });
      await browser.page.screenshot({ path: process.env.METRICS_SCREENSHOT! });
    } finally {
      await browser.close();
    }
  }, 90_000);

  it('the public port does not serve /metrics: the web address answers 404 as before', async () => {
    const r = await curl(['-k', '-o', '/dev/null', '-w', '%{http_code}', `https://${PROXY_IP}:${webPort}/metrics`]);
    expect(r.stdout).toBe('404');
  });
});
