/**
 * useLoad: one request's data, failure and reload, for the pages that show a list. A refusal as the user (a lock,
 * an expired session, a role taken away: clearsData) drops the data as well, so nothing stays on screen under the
 * error that the user may no longer see; other failures keep the last answer shown.
 */
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { ApiError, clearsData } from '../lib/errors.js';

export interface Loaded<T> {
  data: T | undefined;
  error: ApiError | Error | undefined;
  loading: boolean;
  reload: () => void;
}

export function useLoad<T>(load: () => Promise<T>, deps: readonly unknown[] = []): Loaded<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<ApiError | Error | undefined>(undefined);
  const [loading, setLoading] = useState(true);
  const generation = useRef(0);
  const run = useCallback(() => {
    const mine = ++generation.current;
    setLoading(true);
    load().then(
      (d) => {
        if (mine !== generation.current) return;
        setData(d);
        setError(undefined);
        setLoading(false);
      },
      (e: unknown) => {
        if (mine !== generation.current) return;
        if (clearsData(e as Partial<ApiError>)) setData(undefined);
        setError(e instanceof Error ? e : new Error(String(e)));
        setLoading(false);
      },
    );
  }, deps);
  useEffect(() => {
    run();
    return () => {
      generation.current++;
    };
  }, [run]);
  return { data, error, loading, reload: run };
}
