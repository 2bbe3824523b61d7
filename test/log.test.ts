/** The daemon's JSON log lines (src/log.ts): snake_case fields like every JSON the gateway prints, secrets still redacted. */
import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { createLogger, snakeCase } from '../src/log.js';

function capture(): { lines: Array<Record<string, unknown>>; raw: string[]; destination: Writable } {
  const raw: string[] = [];
  const destination = new Writable({
    write(chunk, _enc, cb) {
      raw.push(String(chunk));
      cb();
    },
  });
  return { raw, destination, get lines() { return raw.map((l) => JSON.parse(l) as Record<string, unknown>); } };
}

describe('log lines', () => {
  it('name fields in snake_case, whatever the code calls them', () => {
    const out = capture();
    const log = createLogger({ level: 'info', format: 'json', destination: out.destination }).child({ component: 'test' });
    log.info({ hostId: 'h-1', retryInMs: 500, destIP: '192.0.2.1', heartbeatIntervalMs: 1000, already_snake: 1 }, 'agent connected');
    expect(out.lines[0]).toMatchObject({ component: 'test', host_id: 'h-1', retry_in_ms: 500, dest_ip: '192.0.2.1', heartbeat_interval_ms: 1000, already_snake: 1, msg: 'agent connected' });
    expect(Object.keys(out.lines[0]!).filter((k) => /[A-Z]/.test(k))).toEqual([]);
  });

  it('still redact secrets, under either spelling and nested', () => {
    const out = capture();
    const log = createLogger({ level: 'info', format: 'json', destination: out.destination });
    log.warn({ privateKey: 'SECRET-1', proxyAuthorization: 'Basic SECRET-2', password: 'SECRET-3', request: { privateKey: 'SECRET-4', token: 'SECRET-5' } }, 'careful');
    expect(out.raw.join('')).not.toMatch(/SECRET/);
    expect(out.lines[0]).toMatchObject({ private_key: '***', proxy_authorization: '***', password: '***' });
  });

  it('snakeCase', () => {
    expect(['hostId', 'destIP', 'remoteIPAddress', 'validTo', 'id', 'host_id', 'TTL'].map(snakeCase)).toEqual(['host_id', 'dest_ip', 'remote_ip_address', 'valid_to', 'id', 'host_id', 'ttl']);
  });
});
