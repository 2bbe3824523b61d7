/**
 * Helpers for connection accounting (src/net/deadlines.ts) that the configuration's defaults use too: which
 * "source" a client address counts against, the process's open-file limit, and the caps it can hold.
 */
import { readFileSync } from 'node:fs';
import { isIPv4, isIPv6 } from 'node:net';

/**
 * The key a client address is counted under for the per-source cap: an IPv4 address as it is (IPv4-mapped IPv6
 * addresses included), an IPv6 address by its /64 (one site is routinely given a whole /64, so counting single
 * addresses would let one host open a cap's worth of connections from each of 2^64 addresses).
 */
export function sourceKey(address: string): string {
  const bare = address.replace(/%.*$/, ''); // a zone (fe80::1%eth0) names an interface, not a host
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(bare);
  if (mapped && isIPv4(mapped[1]!)) return mapped[1]!;
  if (isIPv4(bare)) return bare;
  if (!isIPv6(bare)) return bare === '' ? 'unknown' : bare;
  const groups = expandIPv6(bare);
  return `${groups.slice(0, 4).join(':')}::/64`;
}

/** The eight 16-bit groups of a valid IPv6 address, in lowercase without leading zeros. */
function expandIPv6(address: string): string[] {
  let text = address.toLowerCase();
  const v4 = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (v4) {
    const [a, b, c, d] = v4.slice(1).map(Number) as [number, number, number, number];
    text = `${text.slice(0, v4.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head = '', tail] = text.split('::');
  const left = head === '' ? [] : head.split(':');
  const right = tail === undefined || tail === '' ? [] : tail.split(':');
  const zeros = tail === undefined ? [] : new Array<string>(8 - left.length - right.length).fill('0');
  return [...left, ...zeros, ...right].map((g) => parseInt(g, 16).toString(16));
}

/** The soft "Max open files" limit from the text of /proc/<pid>/limits; undefined when absent or unlimited. */
export function parseOpenFileLimit(limits: string): number | undefined {
  const m = /^Max open files\s+(\S+)\s+(\S+)/m.exec(limits);
  if (!m || m[1] === 'unlimited') return undefined;
  const n = Number(m[1]);
  return Number.isSafeInteger(n) && n > 0 ? n : undefined;
}

/** The soft open-file limit of this process (Linux /proc), or undefined when it cannot be read. */
export function readOpenFileLimit(): number | undefined {
  try {
    return parseOpenFileLimit(readFileSync('/proc/self/limits', 'utf8'));
  } catch {
    return undefined;
  }
}

/** Descriptors kept for the process itself (database, logs, pipes, outgoing connections). */
export const RESERVED_DESCRIPTORS = 128;

/**
 * The connections one listener may hold so that a flood on it leaves the others (the web port, the Auth API)
 * room to accept: a quarter of the descriptors left after RESERVED_DESCRIPTORS. Undefined: no known limit.
 */
export function connectionBudget(openFiles: number | undefined): number | undefined {
  return openFiles === undefined ? undefined : Math.max(1, Math.floor((openFiles - RESERVED_DESCRIPTORS) / 4));
}

export const DEFAULT_MAX_CONNECTIONS = 10_000;
export const DEFAULT_MAX_CONNECTIONS_PER_SOURCE = 1_000;

/** gateway.limits.max_connections when not written: 10 000, or the budget of the open-file limit when lower. */
export function defaultMaxConnections(openFiles: number | undefined): number {
  return Math.min(DEFAULT_MAX_CONNECTIONS, connectionBudget(openFiles) ?? DEFAULT_MAX_CONNECTIONS);
}

/** gateway.limits.max_connections_per_source when not written: 1 000, or a quarter of max_connections when lower. */
export function defaultMaxConnectionsPerSource(maxConnections: number): number {
  return Math.min(DEFAULT_MAX_CONNECTIONS_PER_SOURCE, Math.max(1, Math.floor(maxConnections / 4)));
}
