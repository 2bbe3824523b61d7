/** The filter box, and a piece of state kept in the address's query string (so a reload keeps it). */
import { useState } from 'preact/hooks';

export function useUrlState(key: string): [string, (v: string) => void] {
  const [value, setValue] = useState(() => new URLSearchParams(location.search).get(key) ?? '');
  const set = (v: string) => {
    setValue(v);
    const q = new URLSearchParams(location.search);
    if (v) q.set(key, v);
    else q.delete(key);
    const s = q.toString();
    history.replaceState(null, '', `${location.pathname}${s ? `?${s}` : ''}`);
  };
  return [value, set];
}

export function FilterBox({ value, onChange, placeholder }: { value: string; onChange: (v: string) => void; placeholder: string }) {
  return (
    <div class="filter">
      <input type="search" value={value} placeholder={placeholder} maxLength={256} onInput={(e) => onChange(e.currentTarget.value)} data-testid="filter" aria-label="Filter" spellcheck={false} />
      {value ? <button type="button" class="btn btn-ghost btn-small" onClick={() => onChange('')} data-testid="filter-clear">Clear</button> : null}
    </div>
  );
}
