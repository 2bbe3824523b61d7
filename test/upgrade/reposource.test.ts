/**
 * `gateway-upgrade repo set-source`'s rewriting (src/upgrade/reposource.ts), as tables: only the base of the
 * repository's address moves, everything after it and every other word of the entry stay; rpm entries get
 * sslcacert= (dnf, yum) and lose it again; apt's CA file names the Proxy's host only and refuses what apt's
 * configuration syntax could be broken by. apt end to end is test/upgrade/apt-proxy.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { aptCaConf, moveEntry, pathAfterBase, planSource, withSslCaCert } from '../../src/upgrade/reposource.js';
import type { Endpoint } from '../../src/upgrade/endpoint.js';

const DIRECT = 'https://apt.gateway.example';
const PROXY = 'https://proxy.example.com:3080/v1/webapi/autoupdate/repo';
const endpoint = { host: 'proxy.example.com', port: 3080, origin: 'https://proxy.example.com:3080' } as Endpoint;
const settings = { aptRepoUrl: DIRECT, yumRepoUrl: 'https://yum.gateway.example', aptConfDir: '/etc/apt/apt.conf.d', hostCaFile: '/var/lib/gateway/host/host-ca.pem' };

describe('pathAfterBase', () => {
  it.each([
    [`${DIRECT}/debian`, '/debian'],
    [`${PROXY}/debian`, '/debian'],
    ['https://other.example:8443/v1/webapi/autoupdate/repo/ubuntu', '/ubuntu'],
    ['https://mirror.example/gateway/debian', '/gateway/debian'],
    [DIRECT, ''],
  ])('%s -> %s', (url, rest) => expect(pathAfterBase(url, DIRECT)).toBe(rest));

  it('refuses what is not a URL', () => expect(() => pathAfterBase('file:/srv/repo', DIRECT)).toThrow('is not a URL'));
});

describe('moveEntry', () => {
  it('apt: the first deb line\'s URI only; options, suite, channel and comments kept', () => {
    const text = `# Gateway packages\ndeb [signed-by=/usr/share/keyrings/k.asc arch=amd64] ${DIRECT}/debian bookworm stable/v17\ndeb ${DIRECT}/other x y\n`;
    expect(moveEntry({ kind: 'apt', text }, 'https://p:1/v1/webapi/autoupdate/repo', DIRECT)).toBe(
      `# Gateway packages\ndeb [signed-by=/usr/share/keyrings/k.asc arch=amd64] https://p:1/v1/webapi/autoupdate/repo/debian bookworm stable/v17\ndeb ${DIRECT}/other x y\n`,
    );
  });

  it('rpm: baseurl and gpgkey, $basearch and the channel kept; and back', () => {
    const text = '[gateway]\nname=Gateway\nbaseurl=https://yum.gateway.example/rhel/9/Gateway/$basearch/stable/v17\ngpgkey=https://yum.gateway.example/gpg\n';
    const moved = moveEntry({ kind: 'rpm', text }, PROXY, 'https://yum.gateway.example');
    expect(moved).toBe(`[gateway]\nname=Gateway\nbaseurl=${PROXY}/rhel/9/Gateway/$basearch/stable/v17\ngpgkey=${PROXY}/gpg\n`);
    expect(moveEntry({ kind: 'rpm', text: moved }, 'https://yum.gateway.example', 'https://yum.gateway.example')).toBe(text);
  });

  it('an entry with no address to move is an error, not a silent no-op', () => {
    expect(() => moveEntry({ kind: 'apt', text: '# only a comment\n' }, PROXY, DIRECT)).toThrow('no address to move');
  });
});

describe('the CA the package manager trusts for the Proxy', () => {
  it('dnf / yum: sslcacert= after baseurl, replaced rather than repeated, removed for direct', () => {
    const text = '[gateway]\nbaseurl=x\nenabled=1\n';
    const once = withSslCaCert(text, '/ca.pem');
    expect(once).toBe('[gateway]\nbaseurl=x\nsslcacert=/ca.pem\nenabled=1\n');
    expect(withSslCaCert(once, '/other.pem')).toBe('[gateway]\nbaseurl=x\nsslcacert=/other.pem\nenabled=1\n');
    expect(withSslCaCert(once, undefined)).toBe(text);
  });

  it('apt: for the Proxy\'s host only; a host or path apt\'s syntax cannot hold is refused', () => {
    expect(aptCaConf('proxy.example.com', '/ca.pem')).toContain('Acquire::https::proxy.example.com::CaInfo "/ca.pem";');
    expect(() => aptCaConf('proxy";Acquire::x', '/ca.pem')).toThrow(/cannot be told a CA/);
    expect(() => aptCaConf('proxy.example.com', '/a"b.pem')).toThrow(/cannot be written/);
  });

  it('planSource: apt gets the CA file for proxy and its removal for direct; zypper gets no sslcacert', () => {
    const apt = { kind: 'apt' as const, path: '/etc/apt/sources.list.d/gateway.list', text: `deb ${DIRECT}/debian bookworm stable/v17\n`, channel: 'stable/v17' };
    const toProxy = planSource('apt', apt, 'proxy', endpoint, settings);
    expect(toProxy.text).toBe(`deb ${PROXY}/debian bookworm stable/v17\n`);
    expect(toProxy.aptConf?.text).toContain(`CaInfo "${settings.hostCaFile}"`);
    expect(planSource('apt', { ...apt, text: toProxy.text }, 'direct', endpoint, settings)).toMatchObject({ text: apt.text, aptConf: { text: undefined } });
    const zypp = { kind: 'rpm' as const, path: '/etc/zypp/repos.d/gateway.repo', text: '[gateway]\nbaseurl=https://yum.gateway.example/sles/15\n', channel: undefined };
    expect(planSource('zypper', zypp, 'proxy', endpoint, settings).text).not.toContain('sslcacert');
    expect(planSource('dnf', zypp, 'proxy', endpoint, settings, '/corp.pem').text).toContain('sslcacert=/corp.pem');
  });
});
