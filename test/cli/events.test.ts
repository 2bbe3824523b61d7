/** `gwctl get events -f text` (src/cli/events.ts): the columns, the session fields, and hostile text. */
import { describe, expect, it } from 'vitest';
import { eventRow, eventTable } from '../../src/cli/events.js';
import { formatBytes, formatMs } from '../../src/format.js';

describe('the events table', () => {
  it('a row per event: user, resource, client, bytes and duration of sessions that ended', () => {
    const text = eventTable([
      { event: 'user.login', time: '2026-01-01T00:00:00.000Z', user: 'alice', source: '192.0.2.1', method: 'cli' },
      { event: 'db.session.end', time: '2026-01-01T00:01:00.000Z', user: 'alice', resource: 'pg', protocol: 'postgres', db_user: 'orders', db_name: 'shop', client: '192.0.2.1:5000', bytes_in: 1234, bytes_out: 5_600_000, duration_ms: 65_000 },
      { event: 'session.end', time: '2026-01-01T00:02:00.000Z', user: 'alice', login: 'root', node: 'web-1', exit_code: 0 },
      { event: 'app.session.end', time: '2026-01-01T00:03:00.000Z', user: 'mallory', coalesced: 940, errors: 940, resources: ['echo'], bytes_in: 940, bytes_out: 0 },
    ]);
    const lines = text.split('\n');
    expect(lines[0]).toMatch(/^TIME\s+EVENT\s+USER\s+RESOURCE\s+CLIENT\s+BYTES IN\/OUT\s+DURATION\s+NOTE$/);
    expect(lines[1]).toMatch(/user\.login\s+alice\s+192\.0\.2\.1/);
    expect(lines[2]).toMatch(/db\.session\.end\s+alice\s+pg \(postgres, orders@shop\)\s+192\.0\.2\.1:5000\s+1\.2kB\/5\.6MB\s+1m05s/);
    expect(lines[3]).toMatch(/session\.end\s+alice\s+root@web-1\s+.*exit 0/);
    expect(lines[4]).toMatch(/mallory\s+echo\s+940B\/0B\s+940 sessions coalesced \(940 broken\)/);
  });

  it('hostile: an event (an agent reports its own) cannot write control characters to the terminal, nor an endless cell', () => {
    const row = eventRow({ event: 'session.start\u001b[2J', user: 'x\r\u001b]0;owned\u0007', node: 'n'.repeat(1000), login: 'l' });
    for (const c of row) {
      expect(c).not.toMatch(/[\u0000-\u001f\u007f-\u009f]/);
      expect(c.length).toBeLessThanOrEqual(120);
    }
    expect(eventRow({ event: 'db.session.end', bytes_in: -5, duration_ms: 'soon' }).slice(5, 7)).toEqual(['', '']);
  });

  it('formats', () => {
    expect([formatBytes(0), formatBytes(999), formatBytes(1000), formatBytes(2_500_000_000)]).toEqual(['0B', '999B', '1.0kB', '2.5GB']);
    expect([formatMs(850), formatMs(12_340), formatMs(245_000), formatMs(7_800_000)]).toEqual(['850ms', '12.3s', '4m05s', '2h10m']);
    // The Web UI's audit page asks for a space before the unit (src/format.ts serves both).
    expect([formatBytes(999, ' '), formatBytes(5_600_000, ' ')]).toEqual(['999 B', '5.6 MB']);
  });
});
