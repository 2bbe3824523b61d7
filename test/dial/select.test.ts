import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseNoProxy, matchNoProxy } from '../../src/dial/noproxy.js';
import { decisionAttributes, kubeApiAlias, kubeApiTarget, parseProxyValue, parseTarget, selectProxy } from '../../src/dial/select.js';
import { GatewayError } from '../../src/errors.js';

type Env = Record<string, string>;

function decide(target: string, env: Env) {
  const d = selectProxy(target, env);
  return { proxy: d.proxy?.display ?? null, source: d.source };
}

describe('which variable is used', () => {
  const all: Env = {
    HTTPS_PROXY: 'http://upper-https:1',
    https_proxy: 'http://lower-https:2',
    HTTP_PROXY: 'http://upper-http:3',
    http_proxy: 'http://lower-http:4',
  };
  const without = (...names: string[]) => Object.fromEntries(Object.entries(all).filter(([k]) => !names.includes(k)));

  it.each([
    // [target, env, expected proxy, expected source]
    ['proxy.example.com:3024', all, 'http://upper-https:1', 'HTTPS_PROXY'],
    ['proxy.example.com:3024', without('HTTPS_PROXY'), 'http://lower-https:2', 'https_proxy'],
    ['proxy.example.com:3024', without('HTTPS_PROXY', 'https_proxy'), 'http://upper-http:3', 'HTTP_PROXY'],
    ['proxy.example.com:3024', { http_proxy: 'http://lower-http:4' }, 'http://lower-http:4', 'http_proxy'],
    ['https://proxy.example.com/webapi/find', all, 'http://upper-https:1', 'HTTPS_PROXY'],
    ['https://proxy.example.com/', without('HTTPS_PROXY'), 'http://lower-https:2', 'https_proxy'],
    // an https:// URL never falls back to HTTP_PROXY
    ['https://proxy.example.com/', without('HTTPS_PROXY', 'https_proxy'), null, null],
    ['http://proxy.example.com/', all, 'http://upper-http:3', 'HTTP_PROXY'],
    ['http://proxy.example.com/', without('HTTP_PROXY'), 'http://lower-http:4', 'http_proxy'],
    // an http:// URL never uses HTTPS_PROXY
    ['http://proxy.example.com/', without('HTTP_PROXY', 'http_proxy'), null, null],
    // empty (or blank) counts as unset
    ['proxy.example.com:443', { HTTPS_PROXY: '', https_proxy: 'http://lower-https:2' }, 'http://lower-https:2', 'https_proxy'],
    ['proxy.example.com:443', { HTTPS_PROXY: '  ', HTTP_PROXY: 'squid:3128' }, 'http://squid:3128', 'HTTP_PROXY'],
    ['proxy.example.com:443', {}, null, null],
    // ALL_PROXY (then all_proxy) comes last, for every kind of target
    ['proxy.example.com:3024', { ...all, ALL_PROXY: 'socks5h://dante:1080' }, 'http://upper-https:1', 'HTTPS_PROXY'],
    ['proxy.example.com:3024', { http_proxy: 'http://lower-http:4', ALL_PROXY: 'socks5h://dante:1080' }, 'http://lower-http:4', 'http_proxy'],
    ['proxy.example.com:3024', { ALL_PROXY: 'socks5h://dante:1080', all_proxy: 'socks5://other:1' }, 'socks5h://dante:1080', 'ALL_PROXY'],
    ['proxy.example.com:3024', { ALL_PROXY: ' ', all_proxy: 'socks5://other:1' }, 'socks5://other:1', 'all_proxy'],
    ['https://proxy.example.com/', { HTTP_PROXY: 'http://upper-http:3', ALL_PROXY: 'socks5h://dante' }, 'socks5h://dante:1080', 'ALL_PROXY'],
    ['http://proxy.example.com/', { HTTPS_PROXY: 'http://upper-https:1', all_proxy: 'http://squid:3128' }, 'http://squid:3128', 'all_proxy'],
    ['localhost:3080', { ALL_PROXY: 'socks5h://dante:1080' }, null, null],
  ] as Array<[string, Env, string | null, string | null]>)('%s with %o', (target, env, proxy, source) => {
    expect(decide(target, env)).toEqual({ proxy, source });
  });
});

describe('proxy values', () => {
  it.each([
    ['squid.corp:3128', 'http://squid.corp:3128', 'http', 3128],
    ['http://squid.corp:3128', 'http://squid.corp:3128', 'http', 3128],
    ['HTTP://Squid.Corp:3128/', 'http://squid.corp:3128', 'http', 3128],
    ['https://squid.corp:3129', 'https://squid.corp:3129', 'https', 3129],
    ['http://squid.corp', 'http://squid.corp:80', 'http', 80],
    ['https://squid.corp', 'https://squid.corp:443', 'https', 443],
    ['http://10.0.0.5:3128', 'http://10.0.0.5:3128', 'http', 3128],
    ['http://[fd00::5]:3128', 'http://[fd00::5]:3128', 'http', 3128],
    ['127.0.0.2:3128', 'http://127.0.0.2:3128', 'http', 3128],
    ['http://alice@squid:3128', 'http://alice@squid:3128', 'http', 3128],
    ['http://alice:s3cret@squid:3128', 'http://alice:***@squid:3128', 'http', 3128],
    ['socks5://dante.corp', 'socks5://dante.corp:1080', 'socks5', 1080],
    ['SOCKS5H://bob:pw@Dante.Corp:1081', 'socks5h://bob:***@dante.corp:1081', 'socks5h', 1081],
    ['socks5h://[fd00::5]', 'socks5h://[fd00::5]:1080', 'socks5h', 1080],
    ['alice:s3cret@squid:3128', 'http://alice:***@squid:3128', 'http', 3128],
  ] as Array<[string, string, string, number]>)('%s', (value, display, protocol, port) => {
    const p = parseProxyValue(value, 'HTTPS_PROXY');
    expect(p.display).toBe(display);
    expect(p.protocol).toBe(protocol);
    expect(p.port).toBe(port);
  });

  it('percent-decodes credentials and takes userinfo to the last @', () => {
    const p = parseProxyValue('http://dom%5Calice:p%40ss%3Aw0rd@squid:3128', 'HTTP_PROXY');
    expect(p.username).toBe('dom\\alice');
    expect(p.password).toBe('p@ss:w0rd');
    const q = parseProxyValue('http://alice:p@ss/word@squid:3128', 'HTTP_PROXY');
    expect(q.password).toBe('p@ss/word');
    expect(q.host).toBe('squid');
  });

  it.each([
    ['socks4://squid:1080', 'GW_ERR_DIAL_PROXY_ENV'],
    ['socks4a://user:pw@squid:1080', 'GW_ERR_DIAL_PROXY_ENV'],
    ['socks://squid:1080', 'GW_ERR_DIAL_PROXY_ENV'],
    ['socks5h://:pw@squid:1080', 'GW_ERR_DIAL_PROXY_ENV'],
    [`socks5h://${'u'.repeat(256)}:pw@squid:1080`, 'GW_ERR_DIAL_PROXY_ENV'],
    [`socks5h://u:${'p'.repeat(256)}@squid:1080`, 'GW_ERR_DIAL_PROXY_ENV'],
    ['socks5h://user:pw@localhost:1080', 'GW_ERR_DIAL_PROXY_LOOPBACK'],
    ['socks5://127.0.0.1', 'GW_ERR_DIAL_PROXY_LOOPBACK'],
    ['ftp://squid:21', 'GW_ERR_DIAL_PROXY_ENV'],
    ['http://:3128', 'GW_ERR_DIAL_PROXY_ENV'],
    ['http://', 'GW_ERR_DIAL_PROXY_ENV'],
    ['http://user:pw@', 'GW_ERR_DIAL_PROXY_ENV'],
    ['squid:0', 'GW_ERR_DIAL_PROXY_ENV'],
    ['squid:65536', 'GW_ERR_DIAL_PROXY_ENV'],
    ['squid:31x8', 'GW_ERR_DIAL_PROXY_ENV'],
    ['squid:', 'GW_ERR_DIAL_PROXY_ENV'],
    ['http://squid:3128/path', 'GW_ERR_DIAL_PROXY_ENV'],
    ['http://sq uid:3128', 'GW_ERR_DIAL_PROXY_ENV'],
    ['http://fd00::5:3128', 'GW_ERR_DIAL_PROXY_ENV'],
    ['http://u:%zz@squid:3128', 'GW_ERR_DIAL_PROXY_ENV'],
    ['http://localhost:3128', 'GW_ERR_DIAL_PROXY_LOOPBACK'],
    ['LOCALHOST:3128', 'GW_ERR_DIAL_PROXY_LOOPBACK'],
    ['http://127.0.0.1:3128', 'GW_ERR_DIAL_PROXY_LOOPBACK'],
    ['127.0.0.1:3128', 'GW_ERR_DIAL_PROXY_LOOPBACK'],
    ['https://user:pw@localhost.:3128', 'GW_ERR_DIAL_PROXY_LOOPBACK'],
    ['http://[::1]:3128', 'GW_ERR_DIAL_PROXY_LOOPBACK'],
  ])('%s is refused with %s, naming the variable and hiding the password', (value, code) => {
    const secretValue = value.replace('pw@', 'hunter2@');
    let caught: unknown;
    try {
      parseProxyValue(secretValue, 'https_proxy');
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(GatewayError);
    const e = caught as GatewayError;
    expect(e.code).toBe(code);
    expect(e.message).toContain('https_proxy');
    expect(e.message).not.toContain('hunter2');
  });

  it('a bad value is an error for the targets that would use it, never a silent direct dial', () => {
    expect(() => selectProxy('proxy.example.com:443', { HTTPS_PROXY: 'localhost:3128' })).toThrow(GatewayError);
    // ...but HTTP_PROXY is not consulted for an https:// URL, so its bad value does not matter there.
    expect(selectProxy('https://x.example.com/', { HTTP_PROXY: 'ftp://bad' }).proxy).toBeNull();
  });
});

describe('loopback targets', () => {
  const env = { HTTPS_PROXY: 'http://squid:3128', HTTP_PROXY: 'http://squid:3128' };
  it.each(['localhost:3080', 'LOCALHOST:443', 'foo.localhost:443', '127.0.0.1:3024', '127.9.8.7:1', '[::1]:443', 'https://localhost/', 'http://127.0.0.1:8080/'])(
    '%s is dialled directly',
    (target) => {
      const d = selectProxy(target, env);
      expect(d.proxy).toBeNull();
      expect(d.source).toBeNull();
      expect(d.reason).toMatch(/loopback/);
    },
  );
});

describe('NO_PROXY', () => {
  const proxied = (target: string, noProxy: string, extra: Env = {}) =>
    selectProxy(target, { HTTPS_PROXY: 'http://squid:3128', HTTP_PROXY: 'http://squid:3128', NO_PROXY: noProxy, ...extra }).proxy !== null;

  it.each([
    // [target, NO_PROXY, proxied?]
    ['example.com:443', '*', false],
    ['example.com:443', 'foo.com, *', false],
    ['example.com:443', 'example.com', false],
    ['EXAMPLE.com.:443', 'example.COM', false],
    ['a.b.example.com:443', 'example.com', false],
    ['badexample.com:443', 'example.com', true],
    ['example.com:443', '.example.com', true],
    ['a.example.com:443', '.example.com', false],
    ['example.com:443', '*.example.com', true],
    ['a.example.com:443', '*.example.com', false],
    ['example.com:3024', 'example.com:3024', false],
    ['example.com:443', 'example.com:3024', true],
    ['a.example.com:3024', '.example.com:3024', false],
    ['10.1.2.3:443', '10.1.2.3', false],
    ['10.1.2.4:443', '10.1.2.3', true],
    ['10.1.2.3:443', '10.0.0.0/8', false],
    ['11.1.2.3:443', '10.0.0.0/8', true],
    ['10.1.2.3:3024', '10.0.0.0/8:3024', false],
    ['10.1.2.3:443', '10.0.0.0/8:3024', true],
    ['192.168.1.9:443', '192.168.1.0/24, example.com', false],
    ['[2001:db8::1]:443', '2001:db8::1', false],
    ['[2001:db8:0:0::1]:443', '2001:DB8::1', false],
    ['[2001:db8::1]:443', '2001:db8::/32', false],
    ['[2001:db9::1]:443', '2001:db8::/32', true],
    ['[2001:db8::1]:443', '[2001:db8::1]:443', false],
    ['[2001:db8::1]:3024', '[2001:db8::1]:443', true],
    ['[2001:db8::1]:443', '[2001:db8::]/32:443', false],
    ['[2001:db8::1]:443', '[2001:db8::/32]:443', false],
    // names never match IP entries and IPs never match name entries (no DNS lookups)
    ['example.com:443', '93.184.216.34', true],
    ['10.1.2.3:443', 'example.com', true],
    // unparseable entries are ignored (with a warning), the rest still apply
    ['example.com:443', 'exa mple.com, 10.0.0.0/33, ex*.com, example.com', false],
    ['example.com:443', 'exa mple.com', true],
    ['example.com:443', ' , ,', true],
    // an entry that is neither an IPv4 address nor a name is ignored rather than taken as a name
    ['example.com:443', '10.0.0.256, example.com', false],
    ['10.0.0.25:443', '10.0.0.256', true],
  ] as Array<[string, string, boolean]>)('%s with NO_PROXY=%s: proxied=%s', (target, noProxy, expected) => {
    expect(proxied(target, noProxy)).toBe(expected);
  });

  it('applies to URL targets by their port', () => {
    expect(proxied('https://example.com/x', 'example.com:443')).toBe(false);
    expect(proxied('http://example.com/x', 'example.com:443')).toBe(true);
    expect(proxied('http://example.com:8080/x', 'example.com:8080')).toBe(false);
  });

  it('uppercase wins over lowercase; empty counts as unset', () => {
    expect(proxied('a.com:443', 'b.com', { no_proxy: 'a.com' })).toBe(true);
    expect(proxied('a.com:443', '', { no_proxy: 'a.com' })).toBe(false);
  });

  it('names the entry that decided and warns about ignored entries', () => {
    const d = selectProxy('db.internal:5432', { HTTPS_PROXY: 'squid:3128', no_proxy: 'bogus entry, .internal' });
    expect(d.proxy).toBeNull();
    expect(d.source).toBe('no_proxy');
    expect(d.reason).toContain('".internal"');
    expect(d.warnings).toHaveLength(1);
    expect(d.warnings[0]).toContain('bogus entry');
    expect(selectProxy('a.example.com:443', { HTTPS_PROXY: 'squid:3128', NO_PROXY: '300.1.1.1' }).warnings[0]).toContain('over 255');
  });
});

describe('Kubernetes API server dials (rule 5): direct when NO_PROXY exempts the address or kube.<cluster>.local', () => {
  const kube = (apiServer: string, env: Env, cluster = 'example.com') => selectProxy(kubeApiTarget(apiServer), { HTTPS_PROXY: 'http://squid:3128', ...env }, kubeApiAlias(cluster));

  it.each([
    // [NO_PROXY, proxied?, entry for the address, entry for kube.example.com.local]
    ['10.0.0.0/8', false, '10.0.0.0/8', null],
    ['10.96.0.1:443', false, '10.96.0.1:443', null],
    ['kube.example.com.local', false, null, 'kube.example.com.local'],
    ['.local', false, null, '.local'],
    ['10.0.0.0/8,kube.example.com.local', false, '10.0.0.0/8', 'kube.example.com.local'],
    ['192.168.0.0/16,example.org', true, null, null],
    ['10.96.0.1:6443', true, null, null],
  ] as Array<[string, boolean, string | null, string | null]>)('NO_PROXY=%s: proxied=%s', (noProxy, proxied, addressEntry, aliasEntry) => {
    const d = kube('https://10.96.0.1:443', { NO_PROXY: noProxy });
    expect(d.proxy !== null).toBe(proxied);
    expect(d.checks).toEqual([
      { target: '10.96.0.1:443', what: 'the Kubernetes API server', entry: addressEntry },
      { target: 'kube.example.com.local:443', what: "the name of cluster example.com's Kubernetes API", entry: aliasEntry },
    ]);
  });

  it('the reason names what decided', () => {
    expect(kube('https://10.96.0.1', { NO_PROXY: '10.0.0.0/8' }).reason).toBe('NO_PROXY entry "10.0.0.0/8" matches the Kubernetes API server 10.96.0.1:443');
    expect(kube('https://10.96.0.1', { NO_PROXY: 'kube.example.com.local' }).reason).toBe(
      'NO_PROXY entry "kube.example.com.local" matches kube.example.com.local:443, the name of cluster example.com\'s Kubernetes API (10.96.0.1:443 itself is not exempt)',
    );
    expect(kube('https://10.96.0.1', { NO_PROXY: 'example.org' }).reason).toBe(
      'HTTPS_PROXY is set and no NO_PROXY entry matches the Kubernetes API server 10.96.0.1:443 or kube.example.com.local:443, the name of cluster example.com\'s Kubernetes API',
    );
    const unset = kube('https://10.96.0.1', {});
    expect(unset.reason).toBe('HTTPS_PROXY is set and NO_PROXY is not set');
    expect(unset.checks?.map((c) => c.entry)).toEqual([null, null]);
  });

  it('a name API server and a cluster name with "_" or capitals are matched as written', () => {
    expect(kube('https://k8s.internal:6443/', { NO_PROXY: '.internal' }).proxy).toBeNull();
    expect(kube('https://k8s.example.org:6443/', { no_proxy: 'kube.my_cluster.local' }, 'My_Cluster').proxy).toBeNull();
  });

  it('a loopback API server is direct by rule 1, as any loopback target', () => {
    const d = kube('https://127.0.0.1:6443', { NO_PROXY: 'example.org' });
    expect(d.proxy).toBeNull();
    expect(d.reason).toContain('loopback');
  });

  it('the dial is a TLS dial of the gateway\'s own kind: HTTP_PROXY applies when HTTPS_PROXY is unset', () => {
    const d = selectProxy(kubeApiTarget('https://10.96.0.1'), { HTTP_PROXY: 'squid:3129' }, kubeApiAlias('c'));
    expect(d.proxy?.display).toBe('http://squid:3129');
  });

  it('kubeApiTarget takes the api_server URL or host[:port], and refuses a bad address', () => {
    expect(kubeApiTarget('https://[2001:db8::1]:6443/prefix')).toMatchObject({ kind: 'gateway', host: '2001:db8::1', port: 6443 });
    expect(kubeApiTarget('https://K8S.internal')).toMatchObject({ host: 'k8s.internal', port: 443 });
    expect(kubeApiTarget('10.96.0.1:443')).toMatchObject({ host: '10.96.0.1', port: 443 });
    expect(() => kubeApiTarget('https://10.96.0.256')).toThrow(expect.objectContaining({ code: 'GW_ERR_DIAL_BAD_TARGET' }));
  });
});

describe('targets', () => {
  it.each([
    ['proxy.example.com:3024', 'gateway', 'proxy.example.com', 3024],
    ['[2001:db8::1]:443', 'gateway', '2001:db8::1', 443],
    ['https://proxy.example.com/webapi', 'https', 'proxy.example.com', 443],
    ['http://proxy.example.com:8080', 'http', 'proxy.example.com', 8080],
    ['HTTPS://[2001:db8::1]:8443/', 'https', '2001:db8::1', 8443],
  ])('%s', (text, kind, host, port) => {
    expect(parseTarget(text)).toMatchObject({ kind, host, port });
  });
  it.each(['proxy.example.com', 'ftp://x.com/', 'x.com:99999', '2001:db8::1:443', 'https://', ':443'])('%s is a bad target', (text) => {
    expect(() => parseTarget(text)).toThrow(expect.objectContaining({ code: 'GW_ERR_DIAL_BAD_TARGET' }));
  });
  // The host as written is checked by src/addr.ts, also inside URLs (URL() would read 1.2.3 as 1.2.0.3).
  it.each([
    ['10.0.0.256:443', 'over 255'],
    ['1.2.3:443', 'four'],
    ['foo_bar.example.com:443', '"_"'],
    ['https://1.2.3/webapi', 'four'],
    ['https://300.1.1.1/x', 'over 255'],
    ['http://foo_bar.example.com/', '"_"'],
  ])('%s is a bad target: %s', (text, why) => {
    expect(() => parseTarget(text)).toThrow(expect.objectContaining({ code: 'GW_ERR_DIAL_BAD_TARGET', message: expect.stringContaining(why) }));
  });
});

describe('properties', () => {
  // Labels start with a letter: an all-digit name such as 0.0.0.0 is an IP literal, which name entries never match.
  const label = fc.stringMatching(/^[a-z]([a-z0-9-]{0,8}[a-z0-9])?$/);
  const domain = fc.array(label, { minLength: 1, maxLength: 4 }).map((l) => l.join('.'));
  const port = fc.integer({ min: 1, max: 65535 });

  it('never throws anything but a GatewayError, whatever the environment holds', () => {
    fc.assert(
      fc.property(fc.string(), fc.string(), fc.string(), (target, proxy, noProxy) => {
        try {
          selectProxy(target, { HTTPS_PROXY: proxy, NO_PROXY: noProxy });
        } catch (err) {
          expect(err).toBeInstanceOf(GatewayError);
        }
      }),
    );
  });

  it('parseNoProxy never throws and reports every non-blank entry as parsed or warned', () => {
    fc.assert(
      fc.property(fc.array(fc.string(), { maxLength: 8 }), (parts) => {
        const list = parseNoProxy(parts.join(','));
        const nonBlank = parts.join(',').split(',').filter((p) => p.trim() !== '').length;
        expect(list.entries.length + list.warnings.length).toBe(nonBlank);
      }),
    );
  });

  it('a domain entry matches the domain and every subdomain, and no other name', () => {
    fc.assert(
      fc.property(domain, label, domain, port, (d, sub, other, p) => {
        const list = parseNoProxy(d);
        expect(matchNoProxy(list, d, p)).toBeDefined();
        expect(matchNoProxy(list, `${sub}.${d}`, p)).toBeDefined();
        const dot = parseNoProxy(`.${d}`);
        expect(matchNoProxy(dot, d, p)).toBeUndefined();
        expect(matchNoProxy(dot, `${sub}.${d}`, p)).toBeDefined();
        if (other !== d && !other.endsWith(`.${d}`)) expect(matchNoProxy(list, other, p)).toBeUndefined();
      }),
    );
  });

  it('an IPv4 CIDR entry matches exactly the addresses inside it', () => {
    fc.assert(
      fc.property(fc.ipV4(), fc.integer({ min: 0, max: 32 }), fc.ipV4(), (net, prefix, ip) => {
        const toInt = (a: string) => a.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
        const mask = prefix === 0 ? 0 : 2 ** 32 - 2 ** (32 - prefix);
        const inside = (Number(BigInt(toInt(ip)) & BigInt(mask)) === Number(BigInt(toInt(net)) & BigInt(mask)));
        const list = parseNoProxy(`${net}/${prefix}`);
        expect(matchNoProxy(list, ip, 443) !== undefined).toBe(inside);
      }),
    );
  });

  it('a port on an entry restricts it to that port', () => {
    fc.assert(
      fc.property(domain, port, port, (d, p1, p2) => {
        const list = parseNoProxy(`${d}:${p1}`);
        expect(matchNoProxy(list, d, p2) !== undefined).toBe(p1 === p2);
      }),
    );
  });

  it('the password never appears in what is shown', () => {
    fc.assert(
      fc.property(fc.string({ minLength: 4 }).filter((s) => /^[A-Za-z0-9]+$/.test(s)), (pw) => {
        const p = parseProxyValue(`http://alice:${pw}@squid.corp:3128`, 'HTTPS_PROXY');
        expect(p.display).not.toContain(pw);
        expect(p.password).toBe(pw);
      }),
    );
  });
});

describe('SOCKS5 reasons', () => {
  it('say SOCKS5 and where names are resolved', () => {
    expect(selectProxy('proxy.example.com:443', { ALL_PROXY: 'socks5h://dante:1080' }).reason).toBe(
      'ALL_PROXY is set to a SOCKS5 proxy (target names resolved by the proxy) and NO_PROXY is not set',
    );
    expect(selectProxy('proxy.example.com:443', { HTTPS_PROXY: 'socks5://dante:1080', NO_PROXY: '.internal' }).reason).toBe(
      'HTTPS_PROXY is set to a SOCKS5 proxy (target names resolved on this host) and no NO_PROXY entry matches proxy.example.com:443',
    );
  });

  it('NO_PROXY applies as for HTTP proxies', () => {
    const d = selectProxy('db.internal:5432', { ALL_PROXY: 'socks5h://dante:1080', NO_PROXY: '.internal' });
    expect(d.proxy).toBeNull();
    expect(d.source).toBe('NO_PROXY');
  });
});

describe('decisionAttributes: a decision on a span', () => {
  it('how, where, which variable and why, with the proxy password shown as ***', () => {
    const through = decisionAttributes(selectProxy('proxy.example.com:443', { HTTPS_PROXY: 'http://u:secret@squid.corp:3128' }));
    expect(through).toMatchObject({ 'gateway.dial.via': 'proxy', 'gateway.dial.target': 'proxy.example.com:443', 'gateway.dial.proxy': 'http://u:***@squid.corp:3128', 'gateway.dial.source': 'HTTPS_PROXY' });
    expect(through['gateway.dial.reason']).toBe(selectProxy('proxy.example.com:443', { HTTPS_PROXY: 'http://u:secret@squid.corp:3128' }).reason);
    expect(JSON.stringify(through)).not.toContain('secret');
    expect(decisionAttributes(selectProxy('proxy.example.com:443', {}))).toMatchObject({ 'gateway.dial.via': 'direct' });
  });
});
