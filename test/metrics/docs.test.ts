/**
 * docs/operations.md's metrics table is rendered from the metrics' declarations (src/metrics/, their names, types,
 * label sets and help), so it says what the code exports. This test fails when the doc's table differs; run it with
 * METRICS_TABLE_WRITE=1 to write the table into the doc (between its markers), then read the diff.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { renderMetricsTable, TABLE_END, TABLE_START } from '../helpers/metrics.js';

const DOC = new URL('../../docs/operations.md', import.meta.url);

describe('docs/operations.md', () => {
  it('its metrics table is the one rendered from src/metrics/', () => {
    const doc = readFileSync(DOC, 'utf8');
    const start = doc.indexOf(TABLE_START);
    const end = doc.indexOf(TABLE_END);
    expect(start, 'the table markers').toBeGreaterThanOrEqual(0);
    expect(end).toBeGreaterThan(start);
    const table = renderMetricsTable();
    const current = doc.slice(start, end + TABLE_END.length);
    if (process.env.METRICS_TABLE_WRITE === '1' && current !== table) writeFileSync(DOC, doc.slice(0, start) + table + doc.slice(end + TABLE_END.length));
    else expect(current).toBe(table);
  });
});
