/**
 * The PAC sandbox (src/dial/pacscript.ts): pac-resolver on QuickJS. The helpers answer from the lookup given;
 * the hostile scripts (a loop, a throw, not JavaScript, a memory hog, a recursion, a DNS helper that never
 * answers) each end in their error, naming the URL and, for a throw or a syntax error, the line of the file.
 */
import { describe, expect, it } from 'vitest';
import { runPac, type PacLookup } from '../../src/dial/pacscript.js';
import { GatewayError } from '../../src/errors.js';
import { failureOf } from '../helpers/errors.js';

const URL_ = 'http://wpad.corp.test/proxy.pac';
const names: Record<string, string> = { 'intranet.corp.test': '10.1.2.3', 'proxy.example.com': '198.51.100.7' };
const lookup: PacLookup = async (host) => names[host] ?? null;

const findProxy = (body: string, host = 'proxy.example.com', options: Partial<Parameters<typeof runPac>[3]> = {}) =>
  runPac(`function FindProxyForURL(url, host) {\n${body}\n}`, `https://${host}:443/`, host, { url: URL_, lookup, ...options });

const failure = (p: Promise<unknown>): Promise<GatewayError> => failureOf(p, 'the PAC evaluation');

describe('the PAC helpers', () => {
  it('shExpMatch, dnsDomainIs, isPlainHostName, dnsDomainLevels', async () => {
    expect(await findProxy('return [shExpMatch(host, "*.example.com"), dnsDomainIs(host, ".example.com"), isPlainHostName(host), dnsDomainLevels(host)].join(",");')).toBe('true,true,false,2');
  });

  it('dnsResolve, isResolvable and isInNet use the lookup given', async () => {
    expect(await findProxy('return dnsResolve(host) + "," + isResolvable(host) + "," + isResolvable("nowhere.test");')).toBe('198.51.100.7,true,false');
    expect(await findProxy('return isInNet(host, "10.0.0.0", "255.0.0.0") ? "PROXY in:1" : "DIRECT";', 'intranet.corp.test')).toBe('PROXY in:1');
    expect(await findProxy('return isInNet(host, "10.0.0.0", "255.0.0.0") ? "PROXY in:1" : "DIRECT";')).toBe('DIRECT');
  });

  it('myIpAddress answers an IPv4 address of this machine without a network call', async () => {
    expect(await findProxy('return myIpAddress();')).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
  });

  it('the URL it is asked about carries no path', async () => {
    expect(await findProxy('return url;')).toBe('https://proxy.example.com/');
  });

  it('no Node API is reachable from the script', async () => {
    expect(await findProxy('return [typeof require, typeof process, typeof fetch, typeof setTimeout, typeof module].join(",");')).toBe('undefined,undefined,undefined,undefined,undefined');
  });

  it('each evaluation starts from a fresh sandbox: nothing a PAC stores survives', async () => {
    const src = 'var n = (typeof n === "number") ? n : 0;\nfunction FindProxyForURL(url, host) { globalThis.count = (globalThis.count || 0) + 1; return "DIRECT " + globalThis.count; }';
    const a = await runPac(src, 'https://x/', 'x', { url: URL_, lookup });
    const b = await runPac(src, 'https://x/', 'x', { url: URL_, lookup });
    expect([a, b]).toEqual(['DIRECT 1', 'DIRECT 1']);
  });
});

describe('hostile PAC files', () => {
  it('a loop is stopped by the time bound: GW_ERR_DIAL_PAC_TIMEOUT naming the URL', async () => {
    const err = await failure(findProxy('while (true) {}', 'proxy.example.com', { timeMs: 300 }));
    expect(err.code).toBe('GW_ERR_DIAL_PAC_TIMEOUT');
    expect(err.message).toContain(URL_);
  });

  it('a DNS helper that never answers is stopped by the same time bound', async () => {
    const never: PacLookup = () => new Promise(() => undefined);
    const err = await failure(findProxy('return dnsResolve(host);', 'proxy.example.com', { timeMs: 300, lookup: never }));
    expect(err.code).toBe('GW_ERR_DIAL_PAC_TIMEOUT');
  });

  it('a DNS answer that comes after the deadline is dropped: the sandbox is gone, and nothing breaks later', async () => {
    let answered = false;
    const late: PacLookup = () => new Promise((resolve) => setTimeout(() => ((answered = true), resolve('10.9.9.9')), 400));
    const err = await failure(findProxy('return "PROXY " + dnsResolve(host) + ":1";', 'proxy.example.com', { timeMs: 100, lookup: late }));
    expect(err.code).toBe('GW_ERR_DIAL_PAC_TIMEOUT');
    await new Promise((r) => setTimeout(r, 600));
    expect(answered).toBe(true);
    // The next evaluation still works (and vitest fails the file on any error thrown from the late answer).
    expect(await findProxy('return "DIRECT";')).toBe('DIRECT');
  });

  it('a throw names the URL and the line of the file as written', async () => {
    const src = '// corporate PAC\n\nfunction FindProxyForURL(url, host) {\n  var ip = dnsResolve(host);\n\n\n  throw new Error("no rule for " + ip);\n}\n';
    const err = await failure(runPac(src, 'https://proxy.example.com/', 'proxy.example.com', { url: URL_, lookup }));
    expect(err.code).toBe('GW_ERR_DIAL_PAC_SCRIPT');
    expect(err.message).toBe(`the PAC file ${URL_} (line 7): FindProxyForURL threw: no rule for 198.51.100.7`);
    expect(err.details).toMatchObject({ pac: URL_, line: 7 });
  });

  it('a reference error names its line too', async () => {
    const err = await failure(findProxy('var a = 1;\n\n  return a + missing.x;'));
    expect(err.code).toBe('GW_ERR_DIAL_PAC_SCRIPT');
    expect(err.message).toContain('(line 4)');
    expect(err.message).toContain('missing is not defined');
  });

  it('a syntax error names its line', async () => {
    const err = await failure(findProxy('var a = 1;\n  return "PROXY " +;'));
    expect(err.code).toBe('GW_ERR_DIAL_PAC_SCRIPT');
    expect(err.message).toContain(`${URL_} (line 3): not valid JavaScript`);
  });

  it('a file that is not JavaScript (an HTML login page) is a syntax error at line 1', async () => {
    const err = await failure(runPac('<html><body>Please sign in</body></html>', 'https://x/', 'x', { url: URL_, lookup }));
    expect(err.code).toBe('GW_ERR_DIAL_PAC_SCRIPT');
    expect(err.message).toContain('(line 1): not valid JavaScript');
  });

  it('a file without FindProxyForURL says so', async () => {
    const err = await failure(runPac('var proxy = "PROXY a:1";', 'https://x/', 'x', { url: URL_, lookup }));
    expect(err.code).toBe('GW_ERR_DIAL_PAC_SCRIPT');
    expect(err.message).toContain('does not define a function FindProxyForURL');
  });

  it('a memory hog hits the memory bound', async () => {
    const err = await failure(findProxy('var a = [];\n  while (true) a.push("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" + a.length);', 'proxy.example.com', { memoryBytes: 4 * 1024 * 1024, timeMs: 20_000 }));
    expect(err.code).toBe('GW_ERR_DIAL_PAC_SCRIPT');
    expect(err.message).toContain('out of memory');
  });

  it('a runaway recursion is the sandbox stack overflow, not the host', async () => {
    const err = await failure(runPac('function f(n) { return f(n + 1) + 1; }\nfunction FindProxyForURL(url, host) { return f(0); }', 'https://x/', 'x', { url: URL_, lookup }));
    expect(err.code).toBe('GW_ERR_DIAL_PAC_SCRIPT');
    // QuickJS's own guard (a JS exception with the script's line), not the host's stack overflowing under it.
    expect(err.message).toBe(`the PAC file ${URL_} (line 1): FindProxyForURL threw: Maximum call stack size exceeded`);
  });
});
