"""(later issues)"""
