/** `gateway dial-plan` as a user runs it: the built binary, a controlled environment, stdout and exit status. */
import { spawnSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateAuthority, generateKeyPair, issueTlsCert } from '../../src/auth/pki.js';
import { runCli } from '../helpers/gateway.js';

const GATEWAY = fileURLToPath(new URL('../../dist/cli/gateway.js', import.meta.url));

function run(args: string[], env: Record<string, string> = {}) {
  // Only the variables given: the developer's own proxy settings must not leak into the test.
  const r = spawnSync(process.execPath, [GATEWAY, ...args], { env: { PATH: process.env.PATH ?? '', ...env }, encoding: 'utf8' });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

function plan(targets: string[], env: Record<string, string>) {
  const r = run(['dial-plan', '--json', ...targets], env);
  return { status: r.status, stderr: r.stderr, rows: r.stdout.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>) };
}

describe('gateway dial-plan --json', () => {
  it('prints one object per target with proxy, source and reason', () => {
    const { status, rows } = plan(
      ['proxy.example.com:3024', 'https://proxy.example.com/webapi/find', 'http://updates.example.com/', 'db.internal:5432', 'localhost:3080'],
      { HTTPS_PROXY: 'http://alice:hunter22@squid.corp:3128', HTTP_PROXY: 'squid.corp:3129', NO_PROXY: '.internal' },
    );
    expect(status).toBe(0);
    expect(rows).toEqual([
      { target: 'proxy.example.com:3024', proxy: 'http://alice:***@squid.corp:3128', source: 'HTTPS_PROXY', reason: expect.any(String) },
      { target: 'https://proxy.example.com/webapi/find', proxy: 'http://alice:***@squid.corp:3128', source: 'HTTPS_PROXY', reason: expect.any(String) },
      { target: 'http://updates.example.com/', proxy: 'http://squid.corp:3129', source: 'HTTP_PROXY', reason: expect.any(String) },
      { target: 'db.internal:5432', proxy: null, source: 'NO_PROXY', reason: expect.stringContaining('.internal') },
      { target: 'localhost:3080', proxy: null, source: null, reason: expect.stringContaining('loopback') },
    ]);
  });

  it('the reverse tunnel alone can be excluded with host:port, as the seed says', () => {
    const { rows } = plan(['proxy.example.com:3024', 'proxy.example.com:3080'], {
      https_proxy: 'squid.corp:3128',
      NO_PROXY: 'proxy.example.com:3024',
    });
    expect(rows.map((r) => r.proxy)).toEqual([null, 'http://squid.corp:3128']);
  });

  it('a bad proxy value gives an error object for that target and exit status 1, without the password', () => {
    const { status, rows } = plan(['proxy.example.com:443', 'localhost:443'], { HTTPS_PROXY: 'socks5://bob:topsecret@squid:1080' });
    expect(status).toBe(1);
    expect(rows[0]).toEqual({ target: 'proxy.example.com:443', error: { code: 'GW_ERR_DIAL_PROXY_ENV', message: expect.stringContaining('HTTPS_PROXY') } });
    expect(rows[1]).toMatchObject({ target: 'localhost:443', proxy: null });
    expect(JSON.stringify(rows)).not.toContain('topsecret');
  });

  it('refuses a localhost proxy', () => {
    const { status, rows } = plan(['proxy.example.com:443'], { HTTPS_PROXY: 'localhost:3128' });
    expect(status).toBe(1);
    expect(rows[0]).toMatchObject({ error: { code: 'GW_ERR_DIAL_PROXY_LOOPBACK' } });
  });

  it('a target that is not host:port or a URL is an error', () => {
    const { status, rows } = plan(['no-port.example.com'], {});
    expect(status).toBe(1);
    expect(rows[0]).toMatchObject({ error: { code: 'GW_ERR_DIAL_BAD_TARGET' } });
  });

  it('warns on stderr about NO_PROXY entries it ignores', () => {
    const { status, stderr, rows } = plan(['a.example.com:443'], { HTTPS_PROXY: 'squid:3128', NO_PROXY: 'bad entry,example.com' });
    expect(status).toBe(0);
    expect(rows[0]).toMatchObject({ proxy: null, source: 'NO_PROXY' });
    expect(stderr).toContain('bad entry');
  });
});

describe('gateway dial-plan (text)', () => {
  it('prints one readable line per target', () => {
    const r = run(['dial-plan', 'proxy.example.com:443', 'db.internal:5432'], { HTTPS_PROXY: 'squid.corp:3128', NO_PROXY: 'db.internal' });
    expect(r.status).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines).toHaveLength(2);
    expect(lines[0]).toContain('through http://squid.corp:3128');
    expect(lines[1]).toContain('direct');
  });
});

describe('CLI errors', () => {
  it('dial-plan without targets is a usage error with a hint and exit status 2', () => {
    const r = run(['dial-plan']);
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/^error: /m);
    expect(r.stderr).toMatch(/^hint: /m);
    expect(r.stderr).toContain('GW_ERR_USAGE');
  });

  it('an unknown command is a usage error', () => {
    const r = run(['frobnicate']);
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('GW_ERR_USAGE');
  });

  it.each(['gwctl', 'gwsh', 'gateway-upgrade'])('%s prints its usage', (bin) => {
    const r = spawnSync(process.execPath, [fileURLToPath(new URL(`../../dist/cli/${bin}.js`, import.meta.url)), '--help'], { encoding: 'utf8' });
    expect(r.status).toBe(0);
    expect(r.stdout).toContain(`Usage: ${bin}`);
  });

  it('prints the version', () => {
    expect(run(['--version']).stdout.trim()).toBe('17.0.0-dev');
  });
});

describe('gateway dial-plan --kube-api --cluster (the Kubernetes Service\'s dial of an API server)', () => {
  const env = { HTTPS_PROXY: 'http://squid.corp:3128', NO_PROXY: '10.0.0.0/8' };

  it('--json: the decision, and both NO_PROXY checks behind it', () => {
    const { status, rows } = plan(['--kube-api', 'https://10.96.0.1:443', '--cluster', 'example.com'], env);
    expect(status).toBe(0);
    expect(rows).toEqual([
      {
        target: 'https://10.96.0.1:443',
        kube_cluster: 'example.com',
        proxy: null,
        source: 'NO_PROXY',
        reason: 'NO_PROXY entry "10.0.0.0/8" matches the Kubernetes API server 10.96.0.1:443',
        checks: [
          { target: '10.96.0.1:443', what: 'the Kubernetes API server', no_proxy_entry: '10.0.0.0/8' },
          { target: 'kube.example.com.local:443', what: "the name of cluster example.com's Kubernetes API", no_proxy_entry: null },
        ],
      },
    ]);
  });

  it('text: one line for the decision and one per check; exempt by the kube.<cluster>.local name alone', () => {
    const r = run(['dial-plan', 'proxy.example.com:443', '--kube-api', 'https://10.96.0.1', '--cluster', 'example.com'], { HTTPS_PROXY: 'squid.corp:3128', NO_PROXY: 'kube.example.com.local' });
    expect(r.status).toBe(0);
    expect(r.stdout.trim().split('\n')).toEqual([
      'proxy.example.com:443: through http://squid.corp:3128 (to proxy.example.com:443): HTTPS_PROXY is set and no NO_PROXY entry matches proxy.example.com:443',
      "Kubernetes API server https://10.96.0.1 (cluster example.com): direct (to 10.96.0.1:443): NO_PROXY entry \"kube.example.com.local\" matches kube.example.com.local:443, the name of cluster example.com's Kubernetes API (10.96.0.1:443 itself is not exempt)",
      '  NO_PROXY check of 10.96.0.1:443 (the Kubernetes API server): no entry matches',
      "  NO_PROXY check of kube.example.com.local:443 (the name of cluster example.com's Kubernetes API): exempt by \"kube.example.com.local\"",
    ]);
  });

  it('neither exempt: through the proxy, and the reason names both', () => {
    const { rows } = plan(['--kube-api', 'https://10.96.0.1:443', '--cluster', 'example.com'], { HTTPS_PROXY: 'squid.corp:3128', NO_PROXY: '192.168.0.0/16' });
    expect(rows[0]).toMatchObject({ proxy: 'http://squid.corp:3128', source: 'HTTPS_PROXY', reason: expect.stringContaining('10.96.0.1:443 or kube.example.com.local:443') });
  });

  it('--kube-api without --cluster, or nothing at all, is a usage error', () => {
    const half = run(['dial-plan', '--kube-api', 'https://10.96.0.1'], env);
    expect(half.status).toBe(2);
    expect(half.stderr).toContain('--kube-api and --cluster go together');
    expect(run(['dial-plan'], env).status).toBe(2);
  });

  it('a bad API server address is an error row for it', () => {
    const { status, rows } = plan(['--kube-api', 'https://10.96.0.256', '--cluster', 'c'], env);
    expect(status).toBe(1);
    expect(rows[0]).toMatchObject({ target: 'https://10.96.0.256', error: { code: 'GW_ERR_DIAL_BAD_TARGET', message: expect.stringContaining('over 255') } });
  });
});

describe('gateway dial-plan --probe (the TLS peer on the path; behind an inspecting squid: test/e2e/inspect.test.ts)', () => {
  let dir: string;
  let server: tls.Server;
  let silent: net.Server;
  let clusterCaPath: string;
  let otherCaPath: string;
  let port: number;
  let silentPort: number;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-probe-'));
    const ca = await generateAuthority('host', 'probe.example');
    const other = await generateAuthority('host', 'other.example');
    const keys = generateKeyPair();
    const cert = await issueTlsCert(ca, {
      publicKeyPem: keys.publicKeyPem,
      identity: { kind: 'host', name: 'proxy-1', cluster: 'probe.example', roles: ['proxy'] },
      dnsNames: ['localhost'],
      ipAddresses: ['127.0.0.1'],
      ttlMs: 3600_000,
      usage: 'server',
    });
    clusterCaPath = join(dir, 'cluster-ca.pem');
    otherCaPath = join(dir, 'other-ca.pem');
    await writeFile(clusterCaPath, ca.tls.certPem);
    await writeFile(otherCaPath, other.tls.certPem);
    server = tls.createServer({ key: keys.privateKeyPem, cert }, (s) => s.end());
    silent = net.createServer((s) => s.on('error', () => undefined));
    port = await new Promise<number>((resolve) => server.listen(0, '127.0.0.1', () => resolve((server.address() as net.AddressInfo).port)));
    silentPort = await new Promise<number>((resolve) => silent.listen(0, '127.0.0.1', () => resolve((silent.address() as net.AddressInfo).port)));
  });

  afterAll(async () => {
    await new Promise((r) => server.close(r));
    silent.close();
    await rm(dir, { recursive: true, force: true });
  });

  const probe = async (args: string[]) => {
    const r = await runCli('gateway', ['dial-plan', '--json', '--probe', ...args]);
    return { ...r, rows: r.stdout.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>) };
  };

  it("--ca: the certificate's subject and issuer, and that it is the cluster's", async () => {
    const r = await probe(['--ca', clusterCaPath, `localhost:${port}`]);
    expect(r.status).toBe(0);
    expect(r.rows[0]).toMatchObject({ proxy: null, probe: { issuer: 'O=probe.example, CN=probe.example host CA', cluster: true, inspected_by: null } });
  });

  it("another cluster's CA: not the cluster's, and not called inspection on a direct dial", async () => {
    const r = await probe(['--ca', otherCaPath, `localhost:${port}`]);
    expect(r.rows[0]).toMatchObject({ probe: { cluster: false, inspected_by: null } });
  });

  it('a server that never finishes the handshake: GW_ERR_TLS_HANDSHAKE_TIMEOUT within --timeout, exit status 1', async () => {
    const r = await probe(['--timeout', '300', `localhost:${silentPort}`]);
    expect(r.status).toBe(1);
    expect(r.rows[0]).toMatchObject({ probe: { error: { code: 'GW_ERR_TLS_HANDSHAKE_TIMEOUT' } } });
  });

  it('--data-dir without a host identity, or a bad --timeout, is a usage error', async () => {
    expect((await runCli('gateway', ['dial-plan', '--probe', '--data-dir', dir, `localhost:${port}`])).stderr).toContain('holds no host identity');
    expect((await runCli('gateway', ['dial-plan', '--probe', '--timeout', 'soon', `localhost:${port}`])).stderr).toContain('GW_ERR_USAGE');
  });
});
