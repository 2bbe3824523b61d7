/**
 * Runs a PAC file's FindProxyForURL in a sandbox: proxy-agents' pac-resolver on QuickJS compiled to WebAssembly
 * (quickjs-wasi), never Node's vm. The script sees only JavaScript and the PAC helpers (dnsResolve, isInNet,
 * shExpMatch, myIpAddress, dnsDomainIs, ...): no require, no process, no fetch, no timers.
 *
 * Each evaluation gets a fresh QuickJS instance (nothing a PAC stores survives to the next call) with three
 * bounds: PAC_MEMORY_BYTES of heap (QuickJS's memoryLimit: "out of memory" past it), PAC_STACK_BYTES of native
 * stack (a runaway recursion is a QuickJS stack overflow, not the host's), and a deadline of PAC_TIME_MS for the
 * whole call, checked by QuickJS's interrupt handler while the script runs and by a timer while it waits for a
 * DNS helper. Past the deadline the instance is dropped; a helper's late answer is never handed to it.
 *
 * The DNS helpers use the caller's lookup (the Dialer's), so tests and the Dialer resolve alike; myIpAddress
 * reads the machine's interfaces (pac-resolver's own dials 8.8.8.8, which a PAC evaluation must not do).
 *
 * pac-resolver recompiles the script (degenerator turns the DNS helpers' calls into awaits), which moves its
 * lines. A syntax error carries the line of the file as fetched (the parser reads the original); for an error
 * thrown while the script runs, the call is replayed once on the original text, with the helpers answering
 * what they answered the first time, to name the line of the file as fetched.
 */
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { networkInterfaces } from 'node:os';
import { createPacResolver, sandbox as pacHelpers } from 'pac-resolver';
import { QuickJS, type JSValueHandle } from 'quickjs-wasi';
import { GatewayError } from '../errors.js';
import { logger } from '../log.js';

export const PAC_TIME_MS = 2_000;
export const PAC_MEMORY_BYTES = 16 * 1024 * 1024;
export const PAC_STACK_BYTES = 256 * 1024;

/** host -> IPv4 address, or null when it does not resolve. */
export type PacLookup = (host: string) => Promise<string | null>;

export interface PacRunOptions {
  /** Where the script came from: the URL named in every error. */
  url: string;
  lookup: PacLookup;
  timeMs?: number;
  memoryBytes?: number;
}

let wasmModule: Promise<WebAssembly.Module> | undefined;

function quickjsModule(): Promise<WebAssembly.Module> {
  wasmModule ??= readFile(createRequire(import.meta.url).resolve('quickjs-wasi/quickjs.wasm')).then((b) => WebAssembly.compile(b));
  return wasmModule;
}

function myIp(): string {
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  }
  return '127.0.0.1';
}

type Recorded = Map<string, unknown>;

/** The asynchronous helpers, on the caller's lookup; each answer is recorded (for the replay) and dropped once `alive()` is false. */
function asyncHelpers(lookup: PacLookup, alive: () => boolean, recorded: Recorded) {
  const gate = <T>(key: string, p: Promise<T>): Promise<T> =>
    new Promise<T>((resolve) => {
      void p.then((v) => {
        recorded.set(key, v);
        if (alive()) resolve(v);
      });
    });
  const resolveV4 = (host: string) => lookup(String(host)).catch(() => null);
  return {
    dnsResolve: async (host: string) => gate(`dnsResolve ${host}`, resolveV4(host)),
    isResolvable: async (host: string) => gate(`isResolvable ${host}`, resolveV4(host).then((ip) => ip !== null)),
    isInNet: async (host: string, pattern: string, mask: string) =>
      gate(`isInNet ${host} ${pattern} ${mask}`, resolveV4(host).then((ip) => ip !== null && inNet(ip, pattern, mask))),
    myIpAddress: async () => gate('myIpAddress', Promise.resolve(myIp())),
    alert: (message?: string) => {
      logger('dial').debug({ pac: String(message ?? '').slice(0, 200) }, 'PAC alert()');
    },
  };
}

function ipv4(text: string): number | undefined {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(String(text));
  if (!m) return undefined;
  const parts = m.slice(1).map(Number);
  if (parts.some((p) => p > 255)) return undefined;
  return ((parts[0]! << 24) | (parts[1]! << 16) | (parts[2]! << 8) | parts[3]!) >>> 0;
}

/** isInNet's comparison: (ip & mask) == (pattern & mask), all dotted IPv4. */
function inNet(ip: string, pattern: string, mask: string): boolean {
  const [a, p, m] = [ipv4(ip), ipv4(pattern), ipv4(mask)];
  if (a === undefined || p === undefined || m === undefined) return false;
  return ((a & m) >>> 0) === ((p & m) >>> 0);
}

function scriptError(url: string, why: string, line: number | undefined, cause?: unknown): GatewayError {
  const where = line === undefined ? '' : ` (line ${line})`;
  return new GatewayError('GW_ERR_DIAL_PAC_SCRIPT', `the PAC file ${url}${where}: ${why}`, {
    details: { pac: url, ...(line === undefined ? {} : { line }) },
    ...(cause === undefined ? {} : { cause }),
  });
}

function lineOf(stack: string | undefined, url: string): number | undefined {
  for (const frame of (stack ?? '').split('\n')) {
    const at = frame.lastIndexOf(`${url}:`);
    if (at < 0) continue;
    const m = /^(\d+)/.exec(frame.slice(at + url.length + 1));
    if (m) return Number(m[1]);
  }
  return undefined;
}

async function newVm(memoryBytes: number, deadline: number): Promise<QuickJS> {
  return QuickJS.create({
    wasm: await quickjsModule(),
    memoryLimit: memoryBytes,
    maxStackSize: PAC_STACK_BYTES,
    interruptHandler: () => Date.now() > deadline,
  });
}

/**
 * Calls FindProxyForURL(url, host) of `source` in a fresh sandbox; answers what it returned (parse it with
 * parsePacAnswer). Throws GW_ERR_DIAL_PAC_SCRIPT (syntax error, throw, no FindProxyForURL, out of memory) or
 * GW_ERR_DIAL_PAC_TIMEOUT, naming options.url.
 */
export async function runPac(source: string, url: string, host: string, options: PacRunOptions): Promise<unknown> {
  const timeMs = options.timeMs ?? PAC_TIME_MS;
  const memoryBytes = options.memoryBytes ?? PAC_MEMORY_BYTES;
  const deadline = Date.now() + timeMs;
  const timeout = () =>
    new GatewayError('GW_ERR_DIAL_PAC_TIMEOUT', `the PAC file ${options.url} did not answer FindProxyForURL within ${timeMs} ms`, {
      details: { pac: options.url },
    });
  let alive = true;
  const recorded: Recorded = new Map();
  const vm = await newVm(memoryBytes, deadline);
  let timer: NodeJS.Timeout | undefined;
  try {
    let find;
    try {
      find = createPacResolver(vm, source, { filename: options.url, sandbox: asyncHelpers(options.lookup, () => alive, recorded) });
    } catch (err) {
      throw compileError(err, options.url);
    }
    const expired = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(timeout()), Math.max(0, deadline - Date.now()));
    });
    try {
      return await Promise.race([find(url, host), expired]);
    } catch (err) {
      if (err instanceof GatewayError) throw err;
      const message = err instanceof Error ? err.message : String(err);
      if (message === 'interrupted' || Date.now() > deadline) throw timeout();
      const line = await replayLine(source, url, host, options.url, recorded, memoryBytes, deadline + timeMs);
      throw scriptError(options.url, `FindProxyForURL threw: ${message.slice(0, 300)}`, line);
    }
  } finally {
    alive = false;
    clearTimeout(timer);
    vm.dispose();
  }
}

function compileError(err: unknown, url: string): GatewayError {
  const e = err as { lineNumber?: unknown; description?: unknown; message?: unknown; stack?: string };
  if (typeof e.lineNumber === 'number') return scriptError(url, `not valid JavaScript: ${String(e.description ?? e.message)}`, e.lineNumber, err);
  const message = String(e.message ?? err);
  if (/FindProxyForURL/.test(message)) return scriptError(url, 'it does not define a function FindProxyForURL(url, host)', undefined, err);
  return scriptError(url, `it failed while loading: ${message.slice(0, 300)}`, lineOf(e.stack, url), err);
}

/** Replays the call on the original text with the recorded helper answers; the line of the throw, if it throws again. */
async function replayLine(
  source: string,
  url: string,
  host: string,
  filename: string,
  recorded: Recorded,
  memoryBytes: number,
  deadline: number,
): Promise<number | undefined> {
  const vm = await newVm(memoryBytes, deadline);
  try {
    const define = (name: string, fn: (...args: unknown[]) => unknown) => {
      const handle = vm.newFunction(name, (...args: JSValueHandle[]) => toHandle(vm, fn(...args.map((a) => vm.dump(a)))));
      vm.setProp(vm.global, name, handle);
      handle.dispose();
    };
    const helpers: Record<string, (...args: unknown[]) => unknown> = {
      ...(pacHelpers as unknown as Record<string, (...args: unknown[]) => unknown>),
      dnsResolve: (h) => recorded.get(`dnsResolve ${String(h)}`) ?? null,
      isResolvable: (h) => recorded.get(`isResolvable ${String(h)}`) ?? false,
      isInNet: (h, p, m) => recorded.get(`isInNet ${String(h)} ${String(p)} ${String(m)}`) ?? false,
      myIpAddress: () => recorded.get('myIpAddress') ?? myIp(),
      alert: () => undefined,
    };
    for (const [name, fn] of Object.entries(helpers)) define(name, fn);
    const fn = vm.evalCode(`${source}\n;FindProxyForURL`, filename);
    try {
      vm.callFunction(fn, vm.undefined, vm.newString(url), vm.newString(host)).dispose();
    } finally {
      fn.dispose();
    }
    return undefined;
  } catch (err) {
    return lineOf((err as Error).stack, filename);
  } finally {
    vm.dispose();
  }
}

function toHandle(vm: QuickJS, v: unknown): JSValueHandle {
  if (typeof v === 'string') return vm.newString(v);
  if (typeof v === 'number') return vm.newNumber(v);
  if (typeof v === 'boolean') return v ? vm.true : vm.false;
  return v === null ? vm.null : vm.undefined;
}
