/** `gateway dial-plan` as a user runs it: the built binary, a controlled environment, stdout and exit status. */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

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

describe('gateway dial-plan with a PAC file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'gw-dialplan-pac-'));
  const pac = join(dir, 'proxy.pac');
  writeFileSync(pac, 'function FindProxyForURL(url, host) {\n  if (dnsDomainIs(host, ".example.com")) return "SOCKS5 socks.corp:1080; PROXY squid.corp:3128; DIRECT";\n  return "DIRECT";\n}\n');
  const broken = join(dir, 'broken.pac');
  writeFileSync(broken, 'function FindProxyForURL(url, host) {\n  return "PROXY " +;\n}\n');
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('shows the PAC URL, its answer, each entry and the one chosen (text)', () => {
    const r = run(['dial-plan', 'proxy.example.com:443', 'db.internal:5432'], { HTTPS_PROXY: `pac+file://${pac}`, NO_PROXY: '.internal' });
    expect(r.status).toBe(0);
    expect(r.stdout).toBe(
      [
        `proxy.example.com:443: through http://squid.corp:3128 (to proxy.example.com:443): HTTPS_PROXY names the PAC file pac+file://${pac} and no NO_PROXY entry matches proxy.example.com:443`,
        `  PAC file://${pac} answers "SOCKS5 socks.corp:1080; PROXY squid.corp:3128; DIRECT"`,
        '  1. SOCKS5 socks.corp:1080: skipped: this Dialer does not dial socks5:// proxies',
        '  2. PROXY squid.corp:3128: chosen: the first usable entry of the answer; the entry before it cannot be used; the dial moves to the next entry only if this one cannot be reached',
        '  3. DIRECT: tried next if the one before cannot be reached',
        'db.internal:5432: direct (to db.internal:5432): NO_PROXY entry ".internal" matches db.internal:5432',
        '',
      ].join('\n'),
    );
  });

  it('--json carries the PAC and the chosen proxy', () => {
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

