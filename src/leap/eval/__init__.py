"""Evaluation: metrics, backtest, baselines, experiments and reports."""
