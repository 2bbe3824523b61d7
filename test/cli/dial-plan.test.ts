/** `gateway dial-plan` as a user runs it: the built binary, a controlled environment, stdout and exit status. */
import { spawnSync } from 'node:child_process';
import { cp, mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateAuthority, generateKeyPair, issueTlsCert } from '../../src/auth/pki.js';
import { probeLines } from '../../src/cli/dialplan.js';
import { loadGssapi } from '../../src/dial/auth/negotiate.js';
import { runCli } from '../helpers/gateway.js';

const GATEWAY = fileURLToPath(new URL('../../dist/cli/gateway.js', import.meta.url));
let hasKerberosModule = true;
try {
  loadGssapi();
} catch {
  hasKerberosModule = false;
}

const NO_CCACHE = 'FILE:/nonexistent/gw-dial-plan-test-ccache';
const NEGOTIATE_NO = '    Negotiate: no, no Kerberos credentials: KRB5CCNAME names /nonexistent/gw-dial-plan-test-ccache, which does not exist (run kinit, or set KRB5_CLIENT_KTNAME to a keytab)';

function run(args: string[], env: Record<string, string> = {}) {
  // Only the variables given: the developer's own proxy settings must not leak into the test, nor a Kerberos
  // ticket of theirs (a credential cache that does not exist, unless the test gives one).
  const r = spawnSync(process.execPath, [GATEWAY, ...args], { env: { PATH: process.env.PATH ?? '', KRB5CCNAME: NO_CCACHE, ...env }, encoding: 'utf8' });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

function plan(targets: string[], env: Record<string, string>) {
  const r = run(['dial-plan', '-f', 'json', ...targets], env);
  return { status: r.status, stderr: r.stderr, rows: r.stdout.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>) };
}

const EITHER = { family: 'either', reason: expect.stringContaining('Happy Eyeballs') };

describe('gateway dial-plan -f json', () => {
  it('prints one object per target with proxy, source and reason', () => {
    const { status, rows } = plan(
      ['proxy.example.com:3024', 'https://proxy.example.com/webapi/find', 'http://updates.example.com/', 'db.internal:5432', 'localhost:3080'],
      { HTTPS_PROXY: 'http://alice:hunter22@squid.corp:3128', HTTP_PROXY: 'squid.corp:3129', NO_PROXY: '.internal' },
    );
    expect(status).toBe(0);
    const alice = { schemes: ['NTLM', 'Digest', 'Basic'], reason: expect.stringContaining('strongest of NTLM, Digest, Basic'), each: expect.arrayContaining([{ scheme: 'Basic', ok: true, why: 'user "alice" from the proxy URL' }]) };
    const nobody = { schemes: [], reason: expect.stringContaining('answers no authentication challenge'), each: expect.arrayContaining([{ scheme: 'Basic', ok: false, why: 'needs user:password in the proxy URL' }]) };
    expect(rows).toEqual([
      { target: 'proxy.example.com:3024', proxy: 'http://alice:***@squid.corp:3128', source: 'HTTPS_PROXY', reason: expect.any(String), family: EITHER, proxy_auth: alice },
      { target: 'https://proxy.example.com/webapi/find', proxy: 'http://alice:***@squid.corp:3128', source: 'HTTPS_PROXY', reason: expect.any(String), family: EITHER, proxy_auth: alice },
      { target: 'http://updates.example.com/', proxy: 'http://squid.corp:3129', source: 'HTTP_PROXY', reason: expect.any(String), family: EITHER, proxy_auth: nobody },
      { target: 'db.internal:5432', proxy: null, source: 'NO_PROXY', reason: expect.stringContaining('.internal'), family: EITHER, proxy_auth: null },
      { target: 'localhost:3080', proxy: null, source: null, reason: expect.stringContaining('loopback'), family: EITHER, proxy_auth: null },
    ]);
    expect(JSON.stringify(rows)).not.toContain('hunter22');
  });

  it('the reverse tunnel alone can be excluded with host:port, as the seed says', () => {
    const { rows } = plan(['proxy.example.com:3024', 'proxy.example.com:3080'], {
      https_proxy: 'squid.corp:3128',
      NO_PROXY: 'proxy.example.com:3024',
    });
    expect(rows.map((r) => r.proxy)).toEqual([null, 'http://squid.corp:3128']);
  });

  it('a bad proxy value gives an error object for that target and exit status 1, without the password', () => {
    const { status, rows } = plan(['proxy.example.com:443', 'localhost:443'], { HTTPS_PROXY: 'socks4://bob:topsecret@squid:1080' });
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
    expect(lines).toHaveLength(9);
    expect(lines[0]).toContain('through http://squid.corp:3128');
    expect(lines[1]).toBe('  IPv6 or IPv4: the proxy squid.corp:3128 is a name, resolved at each dial; IPv6 and IPv4 addresses are raced (Happy Eyeballs); the proxy resolves proxy.example.com:443 itself');
    expect(lines.slice(2, 7)).toEqual([
      '  proxy authentication: answers no authentication challenge (a 407 fails)',
      NEGOTIATE_NO,
      '    NTLM: no, needs DOMAIN%5Cuser:password in the proxy URL',
      '    Digest: no, needs user:password in the proxy URL',
      '    Basic: no, needs user:password in the proxy URL',
    ]);
    expect(lines[7]).toContain('direct');
    expect(lines[8]).toBe('  IPv6 or IPv4: the target db.internal:5432 is a name, resolved at each dial; IPv6 and IPv4 addresses are raced (Happy Eyeballs)');
  });

  it('says which schemes a proxy URL with credentials answers, strongest first, without the password', () => {
    const r = run(['dial-plan', 'proxy.example.com:443'], { HTTPS_PROXY: 'http://alice:s3cr%40t@squid.corp:3128' });
    expect(r.stdout.trim().split('\n')).toEqual([
      'proxy.example.com:443: through http://alice:***@squid.corp:3128 (to proxy.example.com:443): HTTPS_PROXY is set and NO_PROXY is not set',
      '  IPv6 or IPv4: the proxy squid.corp:3128 is a name, resolved at each dial; IPv6 and IPv4 addresses are raced (Happy Eyeballs); the proxy resolves proxy.example.com:443 itself',
      '  proxy authentication: answers a 407 with the strongest of NTLM, Digest, Basic that the proxy offers, never a weaker one',
      NEGOTIATE_NO,
      "    NTLM: yes, NTLMv2 as alice from the proxy URL (no domain: the proxy's own)",
      '    Digest: yes, user "alice" from the proxy URL; MD5, SHA-256, SHA-512-256, qop=auth',
      '    Basic: yes, user "alice" from the proxy URL',
    ]);
  });

  it('an NTLM account in the proxy URL (DOMAIN%5Cuser): NTLM is the strongest it answers, as DOMAIN\\user', () => {
    const r = run(['dial-plan', 'proxy.example.com:443'], { HTTPS_PROXY: 'http://CORP%5Calice:pw@squid.corp:3128' });
    expect(r.stdout).toContain('  proxy authentication: answers a 407 with the strongest of NTLM, Digest, Basic that the proxy offers, never a weaker one\n');
    expect(r.stdout).toContain('    NTLM: yes, NTLMv2 as CORP\\alice from the proxy URL\n');
    expect(r.stdout).not.toContain('pw@');
  });

  it('the bundle runs without the kerberos module (an optional dependency): Negotiate says so and names the fix', async () => {
    // A copy of the built app whose node_modules has every package but kerberos (symlinks to this checkout's).
    const d = await mkdtemp(join(tmpdir(), 'gw-dialplan-nokrb-'));
    try {
      const root = fileURLToPath(new URL('../../', import.meta.url));
      await cp(join(root, 'dist/cli'), join(d, 'dist/cli'), { recursive: true }); // a copy: node resolves from a symlink's target
      await writeFile(join(d, 'package.json'), await readFile(join(root, 'package.json')));
      await mkdir(join(d, 'node_modules'));
      for (const name of await readdir(join(root, 'node_modules'))) if (name !== 'kerberos') await symlink(join(root, 'node_modules', name), join(d, 'node_modules', name));
      await writeFile(join(d, 'ccache'), 'x');
      const r = spawnSync(process.execPath, [join(d, 'dist/cli/gateway.js'), 'dial-plan', 'proxy.example.com:443'], {
        env: { PATH: process.env.PATH ?? '', HTTPS_PROXY: 'http://proxy.corp.example:8080', KRB5CCNAME: join(d, 'ccache') },
        encoding: 'utf8',
      });
      expect(r.status).toBe(0);
      expect(r.stdout).toMatch(/\n {4}Negotiate: no, the kerberos module cannot be loaded \(.*\): apt-get install libkrb5-dev, then reinstall the gateway\n/);
    } finally {
      await rm(d, { recursive: true, force: true });
    }
  });

  it.skipIf(!hasKerberosModule)('a Kerberos credential cache (KRB5CCNAME) or a keytab (KRB5_CLIENT_KTNAME): Negotiate for HTTP@<proxy host> (skipped without the kerberos package)', async () => {
    const d = await mkdtemp(join(tmpdir(), 'gw-dialplan-krb-'));
    try {
      await writeFile(join(d, 'ccache'), 'x');
      await writeFile(join(d, 'agent.keytab'), 'x');
      const cache = run(['dial-plan', 'proxy.example.com:443'], { HTTPS_PROXY: 'http://proxy.corp.example:8080', KRB5CCNAME: `FILE:${join(d, 'ccache')}` });
      expect(cache.stdout).toContain('  proxy authentication: answers a 407 with the strongest of Negotiate that the proxy offers, never a weaker one\n');
      expect(cache.stdout).toContain(`    Negotiate: yes, Kerberos (SPNEGO) for HTTP@proxy.corp.example with the ticket in KRB5CCNAME=FILE:${join(d, 'ccache')}\n`);
      const keytab = run(['dial-plan', 'proxy.example.com:443'], { HTTPS_PROXY: 'http://proxy.corp.example:8080', KRB5_CLIENT_KTNAME: join(d, 'agent.keytab') });
      expect(keytab.stdout).toContain(`    Negotiate: yes, Kerberos (SPNEGO) for HTTP@proxy.corp.example with tickets from the client keytab KRB5_CLIENT_KTNAME=${join(d, 'agent.keytab')}, cached in KRB5CCNAME=${NO_CCACHE}\n`);
    } finally {
      await rm(d, { recursive: true, force: true });
    }
  });
});
describe('gateway dial-plan on IPv6 networks: the family of each connection, NO_PROXY with IPv6 literals and CIDRs', () => {
  it('an IPv6 proxy, a target its NO_PROXY CIDR exempts, an exempt IPv6 literal with its port, and an IPv4 one', () => {
    const { status, rows } = plan(['proxy.example.com:443', '[fd00:1::2]:443', '[fd00:2::7]:3024', '[fd00:2::7]:443', '192.0.2.1:443'], {
      HTTPS_PROXY: 'http://[fd00::1]:3128',
      NO_PROXY: 'fd00:1::/64,[fd00:2::7]:3024',
    });
    expect(status).toBe(0);
    expect(rows.map((r) => [r.proxy, (r.family as { family: string }).family])).toEqual([
      ['http://[fd00::1]:3128', 'ipv6'],
      [null, 'ipv6'],
      [null, 'ipv6'],
      ['http://[fd00::1]:3128', 'ipv6'],
      ['http://[fd00::1]:3128', 'ipv6'],
    ]);
    expect(rows[0]!.family).toEqual({ family: 'ipv6', reason: 'the proxy [fd00::1]:3128 is an IPv6 address' });
    expect(rows[1]!.reason).toContain('fd00:1::/64');
    expect(rows[2]!.reason).toContain('[fd00:2::7]:3024');
  });

  it('a direct IPv4 literal says IPv4 in the text', () => {
    const r = run(['dial-plan', '192.0.2.1:443'], {});
    expect(r.stdout.split('\n')[1]).toBe('  IPv4: the target 192.0.2.1:443 is an IPv4 address');
  });
});

describe('gateway dial-plan with a SOCKS5 proxy', () => {
  it('says SOCKS5, where names are resolved, and hides the password (the example of docs/dialing.md)', () => {
    const r = run(['dial-plan', 'proxy.example.com:443', 'db.internal:5432', 'https://updates.example.com/v1'], {
      ALL_PROXY: 'socks5h://agent7:s3cr%40t@dante.corp:1080',
      NO_PROXY: '.internal',
    });
    expect(r.status).toBe(0);
    expect(r.stdout).toBe(
      [
        'proxy.example.com:443: through socks5h://agent7:***@dante.corp:1080 (to proxy.example.com:443): ALL_PROXY is set to a SOCKS5 proxy (target names resolved by the proxy) and no NO_PROXY entry matches proxy.example.com:443',
        '  IPv6 or IPv4: the proxy dante.corp:1080 is a name, resolved at each dial; IPv6 and IPv4 addresses are raced (Happy Eyeballs); the proxy resolves proxy.example.com:443 itself',
        '  proxy authentication: SOCKS5: offers username/password (RFC 1929) as user "agent7", sent only if the server chooses it',
        'db.internal:5432: direct (to db.internal:5432): NO_PROXY entry ".internal" matches db.internal:5432',
        '  IPv6 or IPv4: the target db.internal:5432 is a name, resolved at each dial; IPv6 and IPv4 addresses are raced (Happy Eyeballs)',
        'https://updates.example.com/v1: through socks5h://agent7:***@dante.corp:1080 (to updates.example.com:443): ALL_PROXY is set to a SOCKS5 proxy (target names resolved by the proxy) and no NO_PROXY entry matches updates.example.com:443',
        '  IPv6 or IPv4: the proxy dante.corp:1080 is a name, resolved at each dial; IPv6 and IPv4 addresses are raced (Happy Eyeballs); the proxy resolves updates.example.com:443 itself',
        '  proxy authentication: SOCKS5: offers username/password (RFC 1929) as user "agent7", sent only if the server chooses it',
        '',
      ].join('\n'),
    );
    expect(r.stdout + r.stderr).not.toContain('s3cr');
  });

  it('-f json gives the socks5h:// proxy and ALL_PROXY as the source', () => {
    const { rows } = plan(['proxy.example.com:443'], { ALL_PROXY: 'socks5h://agent7:s3cr%40t@dante.corp:1080' });
    expect(rows[0]).toEqual({
      target: 'proxy.example.com:443',
      proxy: 'socks5h://agent7:***@dante.corp:1080',
      source: 'ALL_PROXY',
      reason: expect.stringContaining('SOCKS5'),
      family: EITHER,
      proxy_auth: { schemes: ['username/password'], each: [], reason: expect.stringContaining('RFC 1929') },
    });
  });

  it('socks5:// resolves the target here, and says so; without credentials it offers no authentication', () => {
    const { rows } = plan(['proxy.example.com:443'], { ALL_PROXY: 'socks5://dante.corp:1080' });
    expect((rows[0]!.family as { reason: string }).reason).toContain('proxy.example.com:443 is resolved here and sent to the SOCKS server as an address');
    expect(rows[0]!.proxy_auth).toEqual({ schemes: [], each: [], reason: expect.stringContaining('offers no authentication') });
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

  it('-f json: the decision, and both NO_PROXY checks behind it', () => {
    const { status, rows } = plan(['--kube-api', 'https://10.96.0.1:443', '--cluster', 'example.com'], env);
    expect(status).toBe(0);
    expect(rows).toEqual([
      {
        target: 'https://10.96.0.1:443',
        kube_cluster: 'example.com',
        proxy: null,
        source: 'NO_PROXY',
        reason: 'NO_PROXY entry "10.0.0.0/8" matches the Kubernetes API server 10.96.0.1:443',
        family: { family: 'ipv4', reason: 'the target 10.96.0.1:443 is an IPv4 address' },
        proxy_auth: null,
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
      '  IPv6 or IPv4: the proxy squid.corp:3128 is a name, resolved at each dial; IPv6 and IPv4 addresses are raced (Happy Eyeballs); the proxy resolves proxy.example.com:443 itself',
      expect.stringMatching(/^  proxy authentication: answers no authentication challenge/),
      NEGOTIATE_NO,
      '    NTLM: no, needs DOMAIN%5Cuser:password in the proxy URL',
      '    Digest: no, needs user:password in the proxy URL',
      '    Basic: no, needs user:password in the proxy URL',
      "Kubernetes API server https://10.96.0.1 (cluster example.com): direct (to 10.96.0.1:443): NO_PROXY entry \"kube.example.com.local\" matches kube.example.com.local:443, the name of cluster example.com's Kubernetes API (10.96.0.1:443 itself is not exempt)",
      '  IPv4: the target 10.96.0.1:443 is an IPv4 address',
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
    const r = await runCli('gateway', ['dial-plan', '-f', 'json', '--probe', ...args]);
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

describe('gateway dial-plan with a PAC file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'gw-dialplan-pac-'));
  const pac = join(dir, 'proxy.pac');
  writeFileSync(pac, 'function FindProxyForURL(url, host) {\n  if (dnsDomainIs(host, ".example.com")) return "SOCKS4 socks.corp:1080; PROXY squid.corp:3128; DIRECT";\n  return "DIRECT";\n}\n');
  const broken = join(dir, 'broken.pac');
  writeFileSync(broken, 'function FindProxyForURL(url, host) {\n  return "PROXY " +;\n}\n');
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('shows the PAC URL, its answer, each entry and the one chosen (text)', () => {
    const r = run(['dial-plan', 'proxy.example.com:443', 'db.internal:5432'], { HTTPS_PROXY: `pac+file://${pac}`, NO_PROXY: '.internal' });
    expect(r.status).toBe(0);
    expect(r.stdout).toBe(
      [
        `proxy.example.com:443: through http://squid.corp:3128 (to proxy.example.com:443): HTTPS_PROXY names the PAC file pac+file://${pac} and no NO_PROXY entry matches proxy.example.com:443`,
        `  PAC file://${pac} answers "SOCKS4 socks.corp:1080; PROXY squid.corp:3128; DIRECT"`,
        '  1. SOCKS4 socks.corp:1080: skipped: this Dialer does not dial socks4:// proxies',
        '  2. PROXY squid.corp:3128: chosen: the first usable entry of the answer; the entry before it cannot be used; the dial moves to the next entry only if this one cannot be reached',
        '  3. DIRECT: tried next if the one before cannot be reached',
        'db.internal:5432: direct (to db.internal:5432): NO_PROXY entry ".internal" matches db.internal:5432',
        '  IPv6 or IPv4: the target db.internal:5432 is a name, resolved at each dial; IPv6 and IPv4 addresses are raced (Happy Eyeballs)',
        '',
      ].join('\n'),
    );
  });

  it('-f json carries the PAC and the chosen proxy', () => {
    const { status, rows } = plan(['proxy.example.com:443', 'other.org:443'], { HTTPS_PROXY: `pac+file://${pac}` });
    expect(status).toBe(0);
    expect(rows[0]).toMatchObject({ proxy: 'http://squid.corp:3128', source: 'HTTPS_PROXY', pac: { url: `file://${pac}`, chosen: 'PROXY squid.corp:3128' } });
    expect(rows[1]).toMatchObject({ proxy: null, pac: { answer: 'DIRECT', chosen: 'DIRECT' } });
  });

  it('a PAC with a syntax error is an error naming the file and the line, with status 1', () => {
    const { status, rows } = plan(['proxy.example.com:443'], { HTTPS_PROXY: `pac+file://${broken}` });
    expect(status).toBe(1);
    expect(rows[0]).toMatchObject({ error: { code: 'GW_ERR_DIAL_PAC_SCRIPT', message: expect.stringContaining(`file://${broken} (line 2)`) } });
  });
});

describe('gateway dial-plan --probe through a proxy that asked for authentication', () => {
  it('says which scheme answered the 407 (the route of the probe\'s dial carries it)', () => {
    const leaf = { subject: 'CN=proxy.example.com', issuer: 'CN=Cluster Host CA', selfIssued: false, fingerprint256: 'AA', raw: Buffer.alloc(0) };
    const probed = {
      address: 'proxy.example.com:443',
      route: { proxy: { display: 'http://CORP%5Calice:***@squid.corp:3128', source: 'HTTPS_PROXY', auth: 'NTLM' } },
      chain: [leaf],
      verdict: { cluster: true, root: undefined, inspectedBy: undefined },
    };
    expect(probeLines(probed, 'ca.pem')).toContain('  probe: the proxy asked for authentication; answered with NTLM');
    expect(probeLines({ ...probed, route: { proxy: { display: 'http://squid.corp:3128', source: 'HTTPS_PROXY' } } }, 'ca.pem').join('\n')).not.toContain('answered with');
  });
});
